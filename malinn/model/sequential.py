"""The Sequential model: a linear stack of layers (as Keras's ``keras.Sequential``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..backends.base import Device
from ..layers.base import Layer, sample_shape
from ..layers.dtypes import input_cast, input_dtype
from ..layers.input_layer import KerasTensor
from ..layers.masking import carry_mask
from ..plan.builder import PlanBuilder
from ..plan.tensor import format_shape
from ..registry import register
from .model import PlannedModel

__all__ = ["Sequential"]


def _built_for(layer: Layer, shape: tuple) -> tuple:
    """Builds ``layer`` for inputs of ``shape`` (or checks that a built one, which another model may
    share, takes them); returns its output shape."""
    if not layer.built:
        layer.build(shape)
    else:
        layer.check_reuse(shape)
    return layer.compute_output_shape(shape)


class Sequential(PlannedModel):
    """A linear stack of layers (see :class:`PlannedModel` for plans, passes and threads).

    Args:
        layers: the layers, in order.
        name: the model's name.
        precision: the weights' precision (default ``fp32``; see :class:`PlannedModel`).

    Raises:
        ValueError: an element of ``layers`` is not a malinn layer, or ``precision`` is unknown.
    """

    def __init__(self, layers: Iterable[Layer] | None = None, name: str = "sequential", precision: str = "fp32"):
        super().__init__(name, precision)
        self._sample_shape: tuple | None = None  # one sample's shape, e.g. (784,) or (28, 28)
        self._input_dtype = "float32"  # a malinn.Input's, given first
        self._input_cast: Callable[[np.ndarray], np.ndarray] | None = None
        for layer in layers or []:
            self.add(layer)

    @property
    def input_shapes(self) -> list | None:
        return None if self._sample_shape is None else [self._sample_shape]

    @property
    def input_shape(self) -> tuple | None:
        """The input shape with the batch axis first, as Keras gives it: ``(None, 784)`` (None
        before the model is built)."""
        return None if self._sample_shape is None else (None,) + self._sample_shape

    def add(self, layer: Layer) -> None:
        """Appends a layer (and builds it, where the model is built).

        Args:
            layer: a malinn layer whose name no layer of the model has; or, first, a
                :func:`malinn.Input` (as Keras 3 starts a Sequential), which builds the model for
                its shape and gives it its dtype (what predict casts the input to).

        Raises:
            ValueError: ``layer`` is not a malinn layer, its name is already used, or (the model
                built) it does not take the last layer's output; an Input after a layer, or a
                layer's output given as one; the model is unchanged then.
        """
        if isinstance(layer, KerasTensor):
            if layer.node is not None or self.layers or self._sample_shape is not None:
                raise ValueError(
                    f"Sequential {self.name!r}: a malinn.Input may only come first, before any layer "
                    f"(got {layer!r}{' after layer ' + repr(self.layers[-1].name) if self.layers else ''})"
                )
            self.build(layer.shape)
            self._input_dtype, self._input_cast = layer.dtype, layer.cast
            return
        if not isinstance(layer, Layer):
            raise ValueError(f"Sequential {self.name!r}: expected a malinn layer, got {type(layer).__name__}")
        names, shape = self._names_and_output()
        if layer.name in names:
            raise ValueError(f"Sequential {self.name!r}: a layer named {layer.name!r} is already in the model")
        if shape is not None:  # built: the new layer is built for the last one's output (as build() would)
            shape = _built_for(layer, shape)
            self._recent = {}
            self._plans.clear()
        self.layers.append(layer)
        names.add(layer.name)
        self._known = (self._layers_key(), names, shape)

    def _sample(self) -> tuple:
        """One sample's input shape, of the built model."""
        assert self._sample_shape is not None, f"Sequential {self.name!r} is not built"
        return self._sample_shape

    def _layers_key(self) -> tuple:
        return id(self.layers), len(self.layers), id(self.layers[-1]) if self.layers else None, self._sample_shape

    def _names_and_output(self) -> tuple:
        """``(names, output shape)`` of the layers (the shape None before build), as :meth:`add` left
        them, or found again where the layer list changed since (assigned, edited in place): adding a
        layer to a model of thousands scans none of them."""
        known = self.__dict__.get("_known")
        if known is None or known[0] != self._layers_key():
            shape = None if self._sample_shape is None else self.output_shape_for((None,) + self._sample_shape)
            known = self._known = (self._layers_key(), {layer.name for layer in self.layers}, shape)
        return known[1], known[2]

    @property
    def layer_calls(self) -> list:
        """The layer of each output :meth:`predict_layers` returns, in order (every layer once)."""
        return list(self.layers)

    @property
    def input_dim(self) -> int | None:
        """Values per sample of the input (``None`` before build)."""
        return None if self._sample_shape is None else math.prod(self._sample_shape)

    def build(self, input_shape: Sequence[int | None]) -> None:
        """Builds every layer for inputs of ``input_shape``, batch axis first: ``(None, 784)``.

        Args:
            input_shape: the input's shape with the batch axis first (its size is ignored: ``None``
                or a number).

        Raises:
            ValueError: the shape has no batch axis or a size < 1, or a built layer expects another
                shape.
        """
        sample = sample_shape(input_shape, f"Sequential {self.name!r}")
        self._recent = {}
        shape = (None,) + sample
        for layer in self.layers:  # checked first: a layer another model shares stays as it is
            shape = _built_for(layer, shape)
        self._sample_shape = sample
        self._plans.clear()

    def output_shape_for(self, input_shape: Sequence[int | None]) -> tuple:
        """The model's output shape for ``input_shape`` (batch axis first)."""
        shape = tuple(input_shape)
        for layer in self.layers:
            shape = layer.compute_output_shape(shape)
        return shape

    @property
    def output_shape(self) -> tuple | None:
        """``(None, ...)``: the output shape (``None`` before build)."""
        return None if self._sample_shape is None else self.output_shape_for((None,) + self._sample_shape)

    def _lower(self, builder: PlanBuilder, every_layer: bool) -> list:
        x = builder.input(self._sample())
        outputs = []
        for layer in self.layers:
            x = carry_mask(builder, layer, x, builder.lower(layer, x))  # Keras's mask passed on
            outputs.append(x)
        return outputs if every_layer else [x]

    def _output_shapes(self, every_layer: bool) -> list:
        return self._layer_shapes() if every_layer else [self.output_shape]

    # ---------------------------------------------------------------- inference
    def _input_casts(self) -> list:
        return [self._input_cast]

    def _check_inputs(self, x: Any, convert: bool = True) -> list:
        first = self.layers[0].name if self.layers else self.name
        if isinstance(x, dict):
            raise ValueError(
                f"Sequential {self.name!r} takes one input array, got a dict of {len(x)} "
                f"({', '.join(map(str, x))}); pass the array itself"
            )
        if isinstance(x, (list, tuple)) and x:
            # a list of whole batches, as Keras takes [x] (unbuilt: one item that is itself a batch)
            ndim = self._ndim(x[0], f"layer {first!r}")
            batches = (
                ndim == 1 + len(self._sample_shape) or (len(x) == 1 and self._conformable(ndim, self._sample_shape))
                if self._sample_shape is not None
                else len(x) == 1 and ndim >= 2
            )
            if batches and len(x) != 1:
                raise ValueError(f"Sequential {self.name!r} takes one input array, got a list of {len(x)} arrays")
            if batches:
                x = x[0]
        was_array = isinstance(x, np.ndarray)
        x = self._as_float32(x, f"layer {first!r}")
        if self._sample_shape is None and x.ndim >= 2:
            with self._lock:  # built for the first call's shape; another thread's may win: checked below
                if self._sample_shape is None:
                    self.build((None,) + x.shape[1:])
        given = x.shape
        if self._sample_shape is not None:
            x = self._conformed(x, (None,) + self._sample_shape)
        if self._sample_shape is None or x.shape[1:] != self._sample_shape:
            expected = (
                format_shape((None,) + self._sample_shape) if self._sample_shape is not None else "(None, features)"
            )
            raise ValueError(
                f"Input of layer {first!r} is incompatible with the layer: expected shape {expected}, "
                f"found shape {given}{self._one_sample_hint(given, self._sample_shape, was_array)}"
            )
        if not self.built:  # a layer added since, not built yet
            with self._lock:
                if not self.built:
                    self.build((None,) + self._sample_shape)
        return [self._contiguous(x, self._input_cast)] if convert else [x]

    def predict(
        self,
        x: Any,
        batch_size: int | None = None,
        verbose: str | int = "auto",
        steps: int | None = None,
        devices: str | Device | list | tuple | None = None,
    ) -> np.ndarray:
        """Runs the model on ``x``, as Keras's ``predict``.

        Args:
            x: a numeric array of shape ``(batch, ...)`` matching the model's input (a memory-mapped
                ``.npy``, ``np.load(path, mmap_mode="r")``, is read one batch at a time); float64
                and integers are cast to float32 as Keras does, and its rank adjusted as Keras's:
                the last axis added for an input whose last size is 1, an extra last axis of 1
                dropped. Or an iterable of such batches (a generator, a data loader; an item
                ``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)`` gives its ``x``, as Keras):
                one batch is held at a time (:mod:`malinn.model.batches`).
            batch_size: samples per device pass. Default: the whole array in one pass (Keras's
                default is 32; one pass is malinn's fastest) up to 512 MiB of input, split where
                the device's largest allocation requires it (:meth:`max_batch`), into passes of
                512 MiB of input for a larger array (160 MiB, at most one share per device, with
                several devices), of 64 MiB for a memory-mapped array, and each
                batch of an iterable as it comes; on a device whose memory is the host's (PoCL,
                Mali, Adreno) a pass also holds at most 256 MiB of activations, about
                (``batches.SHARED_PASS_BYTES``). Every pass, the shorter last one too, runs the
                plan of this size, so a sample's result does not depend on its pass; calls with
                other pass sizes may run another kernel (a small-batch kernel below 16 samples,
                for instance), whose sums differ in the last bits (docs/KERNELS.md).
            verbose: Keras's: 0 silent, 1 a progress bar, 2 one line at the end, on stdout; "auto"
                (the default) is 1 on a terminal where more than one batch of ``batch_size`` runs
                (or of a memory-mapped array's passes, or an iterable's), else 0
                (:mod:`malinn.model.progbar`). A first plan's kernel builds are reported on stderr
                whatever its value (:mod:`malinn.plan.progress`, ``MALINN_PROGRESS=0`` silences them).
            steps: the batches to draw from an iterable (all where None), as Keras's; with an array,
                the first ``steps * batch_size`` samples, or where ``batch_size`` is not given every
                sample, in ``steps`` batches (Keras's). Fewer batches than ``steps``: a UserWarning,
                as Keras, and the outputs of those there are.
            devices: the devices to spread the passes over (a list of what :func:`malinn.set_device`
                takes: ``["0:0", "0:1"]``; one plan per entry, each with a pass in flight, results in order);
                default: the list given to ``set_device``, else the current device.

        Returns:
            A float32 array of shape ``(samples,) + output_shape[1:]``.

        Raises:
            ValueError: ``x`` is not numeric or its shape differs from the model's input;
                ``batch_size``, ``steps`` or ``verbose`` is not one Keras takes; the model has no
                layers.
            DeviceError: the device failed (out of memory, a failed launch), or even one sample's
                activations exceed its largest allocation; the message names the layer, the shape
                and (with several devices) the device; or an entry of ``devices`` matches no device.
        """
        return self._run(x, batch_size, False, verbose, steps, devices)[0]

    def predict_layers(self, x: Any) -> list:
        """Runs the model on ``x`` and returns every layer's output, for layer-by-layer checks.

        Args:
            x: as for :meth:`predict`.

        Returns:
            A list with one float32 array per layer, in order, each in Keras's output shape.
        """
        return self._run(x, None, every_layer=True)

    def _layer_shapes(self) -> list:
        shapes, shape = [], (None,) + self._sample()
        for layer in self.layers:
            shape = layer.compute_output_shape(shape)
            shapes.append(shape)
        return shapes

    def __call__(self, x: Any, training: bool | None = None) -> np.ndarray:
        """:meth:`predict` on ``x`` (see :meth:`PlannedModel.called_on`)."""
        return self.predict(self.called_on(x, training))

    # ---------------------------------------------------------------- config and summary
    def get_config(self) -> dict:
        """The name, one sample's input shape, each layer's class name and config and the weights'
        precision (what :meth:`from_layers` rebuilds the model from)."""
        return {
            "name": self.name,
            "input_shape": list(self._sample_shape) if self._sample_shape else None,
            **({"input_dtype": self._input_dtype} if self._input_dtype != "float32" else {}),
            "precision": self.precision,
            "layers": [{"class_name": type(layer).__name__, "config": layer.get_config()} for layer in self.layers],
        }

    @classmethod
    def from_layers(cls, config: dict, layers: list, precision: str = "fp32") -> "Sequential":
        """The model :meth:`get_config` describes, with ``layers`` (made from its layer configs),
        built where the config names its input shape."""
        model = cls(layers, name=config["name"], precision=precision)
        if config.get("input_shape") is not None:
            model.build([None] + list(config["input_shape"]))
        if config.get("input_dtype", "float32") != "float32":  # files without one: float32
            model._input_dtype = input_dtype(config["input_dtype"], f"Sequential {model.name!r}'s input")
            model._input_cast = input_cast(model._input_dtype)
        return model

    def _summary_rows(self, kernels: dict) -> list:
        rows = [("Layer (type)", "Output Shape", "Param #", "Kernel")]
        shape = (None,) + self._sample_shape if self._sample_shape is not None else None
        for layer in self.layers:
            shape = layer.compute_output_shape(shape) if shape is not None else None
            rows.append(
                (
                    layer.summary_label(),
                    format_shape(shape) if shape else "?",
                    str(layer.count_params()),
                    kernels.get(layer.name, ""),
                )
            )
        return rows


register("model", Sequential)
