"""The Dense layer: ``y = activation(x @ kernel + bias)``, run as ``R = W x I`` (Rovder 5.3.2)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..library.kernel_library import KernelSpec
from ..library.layout import parse_layout
from ..library.precision import check_precision, device_bytes, effective, quantize_int8
from ..plan import kinds
from ..plan.tensors import Vector, Weight
from .activation import get_activation
from .base import Layer, folded_affine, glorot_uniform, numeric_weights, write_weights, zeros
from .keras_config import KerasContext, keras_activation

if TYPE_CHECKING:
    from ..library.layout import Layout
    from ..plan.builder import PlanBuilder
    from ..plan.tensors import Value

__all__ = ["Dense"]


class Dense(Layer):
    """A fully-connected layer, applied to the last axis of its input (as Keras does).

    Keras computes ``x @ kernel + bias`` with ``x`` (..., in) and ``kernel`` (in, units); malinn
    computes ``W x I`` with ``W = kernel^T`` and ``I`` the input's matrix view (in x everything
    else), which is the same memory read in another layout, so nothing is transposed.

    Args:
        units: the number of output features, a positive integer.
        activation: the activation's name, or ``None`` for linear.
        use_bias: whether the layer adds a bias vector.
        name: the layer's name.

    Raises:
        ValueError: ``units`` is not a positive integer or ``activation`` is unknown.
    """

    weight_names = ("kernel", "bias")

    reusable_on_other_shapes = True

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "Dense":
        activation = keras_activation(config.get("activation"), keras)
        return cls(
            int(config["units"]), activation=activation, use_bias=bool(config.get("use_bias", True)), name=keras.name
        )

    @classmethod
    def from_keras_time_distributed(cls, config: dict, keras: KerasContext) -> "Dense":
        return cls.from_keras_config(config, keras)  # on the last axis: each time step as it is

    def __init__(self, units: int, activation: Any = None, use_bias: bool = True, name: str | None = None):
        super().__init__(name)
        if isinstance(units, bool) or not isinstance(units, (int, np.integer)) or units < 1:
            raise ValueError(f"Dense layer {self.name!r}: units must be a positive integer, got {units!r}")
        self.units = int(units)
        self.activation = get_activation(activation)
        self.use_bias = bool(use_bias)
        self.kernel: np.ndarray | None = None
        self.bias: np.ndarray | None = None
        #: (layout, padded, flat, precision) of W as a malinn model file stored it, uploaded as is
        #: when it fits
        self.prepacked: tuple[Layout, tuple, np.ndarray, str] | None = None
        #: (q, scales): W's int8 form (units x in int8, one float scale per unit) when the weights
        #: came quantized (a Keras int8 Dense, an int8-weights model file); int8-weights uploads it
        self.quantized: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def input_dim(self) -> int | None:
        """Input features (the last axis), once built."""
        return None if self.input_shape is None else self.input_shape[-1]

    def build(self, input_shape: Any) -> None:
        """Creates ``kernel`` (in, units) with Glorot-uniform values and a zero ``bias``."""
        super().build(input_shape)
        features = self._features()
        self.kernel = glorot_uniform((features, self.units), features, self.units)
        self.bias = zeros(self.units) if self.use_bias else None
        self.prepacked = None
        self.quantized = None

    def _features(self) -> int:
        """:attr:`input_dim` of the built layer."""
        assert self.input_shape is not None, f"{self._what()} is not built"
        return self.input_shape[-1]

    def _kernel(self) -> np.ndarray:
        """``kernel`` of the built layer."""
        assert self.kernel is not None, f"{self._what()} is not built"
        return self.kernel

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return tuple(input_shape)[:-1] + (self.units,)

    def lower(self, builder: PlanBuilder, x: Value) -> Value:
        quantized = self.quantized
        weight = Weight(
            f"layer {self.name!r} kernel",
            (self.units, self._features()),
            lambda: self._kernel().T,
            self.device_copies,
            self.prepacked,
            (lambda: quantized) if quantized is not None else None,
        )
        bias = Vector(f"layer {self.name!r} bias", self.bias, self.device_copies) if self.use_bias else None
        return kinds.matmul(builder, x, weight, bias, self.activation, what=self._what())

    def set_weights(self, weights: Any) -> None:
        """Sets ``[kernel, bias]`` (or ``[kernel]`` without bias) in Keras's shapes.

        Raises:
            ValueError: the count or a shape differs from the layer's.
        """
        weights = numeric_weights(weights, f"Dense layer {self.name!r}")
        want = 1 + self.use_bias
        if len(weights) != want:
            raise ValueError(
                f"Dense layer {self.name!r} expects {want} weight arrays "
                f"(kernel{', bias' if self.use_bias else ''}), got {len(weights)}"
            )
        kernel = weights[0]
        if kernel.ndim != 2 or kernel.shape[1] != self.units or (self.built and kernel.shape[0] != self.input_dim):
            expected = (self.input_dim if self.built else "in", self.units)
            raise ValueError(f"Dense layer {self.name!r}: kernel shape {kernel.shape} does not match {expected}")
        if self.use_bias and weights[1].shape != (self.units,):
            raise ValueError(f"Dense layer {self.name!r}: bias shape {weights[1].shape} does not match ({self.units},)")
        if not self.built:
            Layer.build(self, (None, kernel.shape[0]))
        self.kernel = kernel.astype(np.float32, copy=True)
        self.bias = weights[1].astype(np.float32, copy=True) if self.use_bias else None
        self.prepacked = None
        self.quantized = None
        self._weights_changed()

    def kernel_matrices(self) -> dict:
        return {0: ("kernel", self._kernel().T)}

    def absorb_affine(self, scale: Any, shift: Any) -> bool:
        """Folds a following BatchNormalization (``y * scale + shift`` per unit) into the weights,
        in float64, when this layer is linear."""
        if self.activation != "linear" or not self.built:
            return False
        kernel, bias = folded_affine(self.kernel, self.bias if self.use_bias else None, scale, shift)
        self.use_bias = True
        self.set_weights([kernel, bias])
        return True

    def absorb_input_affine(self, scale: Any, shift: Any) -> bool:
        """Folds a preceding per-feature ``x * scale + shift`` into the weights (``kernel`` rows
        scaled, ``shift @ kernel`` added to the bias), in float64. Done only where it adds no
        constant (``shift`` all zero): a folded shift would be summed with large inputs near it and
        cancel, which Keras, subtracting first, does not."""
        s64, t64 = np.asarray(scale, np.float64), np.asarray(shift, np.float64)
        if not self.built or t64.any() or s64.shape != (self.input_dim,):
            return False
        kernel = self._kernel().astype(np.float64) * s64[:, None]
        self.set_weights([kernel.astype(np.float32)] + ([self.bias] if self.use_bias else []))
        return True

    # ---------------------------------------------------------------- model files
    def save_own_variables(self, store: Any, target: KernelSpec) -> None:
        """``W = kernel^T`` laid out as ``target`` reads its left operand, in ``target``'s precision
        (float32; float16; int8 with dataset ``kernel_scales``, one float per unit), and the bias."""
        padded = target.padded_shapes(self.units, self._features(), 1)["a"]
        layout = target.matrices["a"].layout
        precision = target.precision
        w = self._kernel().T
        if precision == "int8-weights":
            q, scales = self.quantized if self.quantized is not None else quantize_int8(w, f"{self._what()} kernel")
            stored = layout.pack(q.astype(np.float32), padded).astype(np.int8)
            write_weights(store, "kernel_scales", scales)
        else:
            stored = device_bytes(w, precision, layout, padded, what=f"{self._what()} kernel")
        data = write_weights(store, "kernel_laid_out", stored)
        data.attrs["layout"] = str(layout)
        data.attrs["padded"] = list(padded)
        data.attrs["shape"] = [self.units, self.input_dim]
        data.attrs["precision"] = precision
        if self.use_bias:
            write_weights(store, "bias", self.bias)

    def load_own_variables(self, store: Any) -> None:
        data = store["kernel_laid_out"]
        layout = parse_layout(str(data.attrs["layout"]))
        rows, cols = (int(v) for v in data.attrs["padded"])
        units, features = (int(v) for v in data.attrs["shape"])
        padded, shape = (rows, cols), (units, features)
        precision = check_precision(str(data.attrs.get("precision", "fp32")))
        stored = np.asarray(data[()])
        quantized = None
        if precision == "int8-weights":
            scales = np.asarray(store["kernel_scales"][()], dtype=np.float32).reshape(-1)
            if scales.size != shape[0]:  # one per output row; one number would be broadcast unnoticed
                raise ValueError(f"{self._what()}: {scales.size} int8 scales for a kernel of {shape[0]} rows")
            quantized = (layout.unpack(stored, shape, padded).astype(np.int8), scales)
            w = effective(None, precision, quantized)
        else:
            w = layout.unpack(stored, shape, padded)  # float16 values are exact in float32
        weights = [w.T]
        if self.use_bias:
            weights.append(np.asarray(store["bias"][()], dtype=np.float32))
        self.set_weights(weights)
        self.quantized = quantized
        flat = (
            device_bytes(w, precision, layout, padded, quantized, f"{self._what()} kernel")
            if precision != "fp32"
            else stored.astype(np.float32)
        )
        self.prepacked = (layout, padded, flat, precision)

    def get_config(self) -> dict:
        return {**super().get_config(), "units": self.units, "activation": self.activation, "use_bias": self.use_bias}
