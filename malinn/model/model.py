"""Models: :class:`PlannedModel`, what every model shares: plans per device and batch bucket,
predict, memory, weights, saving and the summary. :class:`~malinn.model.sequential.Sequential` and
:class:`~malinn.model.functional.Functional` are its two kinds."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..backends.base import Device
from ..backends.selection import get_device
from ..choice.kernel_choice import epoch as choice_epoch
from ..library.precision import check_precision
from ..plan.builder import PlanBuilder
from ..plan.plan import Plan
from ..registry import lookup
from .buckets import batch_bucket
from .memory import MemoryLimits
from .predicting import Predicting
from .saving import save_model
from .summary import Summarizing

if TYPE_CHECKING:
    from ..layers.base import Layer
    from .host import LastCall

__all__ = ["PlannedModel", "batch_bucket"]

#: plans kept per model (each holds its activation buffers): always the last _PLANS_KEPT, and up to
#: _PLANS_KEPT_MOST while the kept plans' activation buffers total at most _PLANS_KEPT_BYTES (a
#: service that answers 1..N samples at a time would otherwise make a plan on every call past N = 8:
#: 2 ms a predict against 0.1 ms for a small model)
_PLANS_KEPT = 8
_PLANS_KEPT_MOST = 128
_PLANS_KEPT_BYTES = 64 * 2**20


class PlannedModel(Predicting, MemoryLimits, Summarizing):
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
        self.layers: list[Layer] = []
        self.source: dict | None = None  # the Keras file it came from, when converted (its provenance)
        self._lock = threading.RLock()  # guards the caches below (never held while planning)
        self._plans: OrderedDict[tuple, tuple[tuple, Plan, int]] = OrderedDict()
        self._planning: dict[tuple, threading.Lock] = {}  # a lock per plan being made: several threads make it once
        # the recent one-pass calls by their samples (at most _RECENT_KEPT, the newest last): each
        # (device, samples, stamp, limits, plan, plain input shape), so that calls alternating
        # between a few sizes (a server's batches) each go straight to their plan
        self._recent: dict[int, LastCall] = {}
        self._max_batches: OrderedDict[tuple, int] = OrderedDict()  # what max_batch found, by device, model and limit

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
                self._recent = {}

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
        key = self._plan_key(batch, device, every_layer, replica)
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
                    plan = self._compile(device, batch_bucket(batch), every_layer).allocate(
                        model=self.name, replica=replica
                    )
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

    def _plan_key(self, batch: int, device: Device, every_layer: bool, replica: int) -> tuple:
        """The key of :meth:`plan`'s kept plans: the device object itself (two GPUs of one model and
        driver have the same identity string), the bucket, the outputs, the precision, the replica."""
        return (device.identity, id(device), batch_bucket(batch), every_layer, self._precision, replica)

    def _kept_plan(self, batch: int, device: Device, every_layer: bool = False, replica: int = 0) -> Plan | None:
        """The plan :meth:`plan` would return where it is kept already, else None (nothing made,
        nothing waited for but the model's own lock, which no one holds while waiting)."""
        key = self._plan_key(batch, device, every_layer, replica)
        stamp = self._stamp()
        with self._lock:
            return self._cached_plan(key, stamp)

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

    def predict(
        self,
        x: Any,
        batch_size: int | None = None,
        verbose: str | int = "auto",
        steps: int | None = None,
        devices: str | Device | list | tuple | None = None,
    ) -> np.ndarray | list[np.ndarray] | dict[str, np.ndarray]:
        """Runs the model on ``x``, as Keras's ``predict`` (each kind's own documents it)."""
        raise NotImplementedError

    def get_config(self) -> dict:
        """The model's configuration (what :meth:`from_config` makes it from again)."""
        raise NotImplementedError

    @classmethod
    def from_layers(cls, config: dict, layers: list, precision: str = "fp32") -> PlannedModel:
        """The model :meth:`get_config` describes, with ``layers`` made from its layer configs."""
        raise NotImplementedError

    # ---------------------------------------------------------------- weights and files
    def get_weights(self) -> list:
        """Every layer's weights, in order, in Keras's shapes."""
        return [w for layer in self.layers for w in layer.get_weights()]

    def set_weights(self, weights: Iterable[Any]) -> None:
        """Sets every layer's weights from a flat list, as ``get_weights`` returns it.

        Args:
            weights: the arrays in Keras's shapes and layer order (a Dense layer's kernel
                ``(in, out)``, then its bias ``(out,)``).

        Raises:
            ValueError: the model is not built, or the count or a shape does not match (no layer's
                weights are changed then).
        """
        if isinstance(weights, (str, bytes, dict)) or not hasattr(weights, "__iter__"):
            raise ValueError(
                f"{type(self).__name__} {self.name!r}: set_weights takes a list of arrays, as "
                f"get_weights returns it; got {type(weights).__name__}"
            )
        weights = list(weights)
        if not self.built:
            raise self._not_built()
        before = [layer.weight_arrays() for layer in self.layers]  # read-only: kept as they are
        want = sum(len(w) for w in before)
        if len(weights) != want:
            raise ValueError(f"{type(self).__name__} {self.name!r} expects {want} weight arrays, got {len(weights)}")
        done = []
        try:
            for layer, old in zip(self.layers, before):
                layer.set_weights(weights[: len(old)])
                done.append((layer, old))
                weights = weights[len(old) :]
        except Exception:  # all or nothing, as Keras: the layers set before the bad array get theirs back
            for layer, old in done:
                layer.set_weights(old)
            raise

    def save(self, path: str | os.PathLike[str], target: str | None = None, overwrite: bool = False) -> Path:
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

    def __reduce__(self) -> tuple:
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


def _unpickled(cls: type[PlannedModel], config: dict, weights: list | None, source: dict | None) -> PlannedModel:
    """The model :meth:`PlannedModel.__reduce__` pickled."""
    model = cls.from_config(config)
    if weights is not None:
        model.set_weights(weights)
    model.source = source
    return model
