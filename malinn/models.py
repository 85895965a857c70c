"""Models: :class:`Sequential`, a chain of layers run on one OpenCL device (Rovder 5.3)."""

from __future__ import annotations

import threading

import numpy as np

from .device import Device, get_device
from .errors import DeviceError
from .layers.base import Layer
from .matrix import DeviceMatrix

__all__ = ["Sequential"]

#: more than any kernel pads a dimension by (layout chunks and work-group tiles are at most 128)
_PAD_BOUND = 1024


class Sequential:
    """A linear stack of layers.

    The input goes to the device once per pass; activations stay there between layers, in the
    layouts the chosen kernels declare; the output comes back once per pass. A batch whose
    activations would not fit in one device allocation is split into passes automatically
    (:meth:`max_batch`).

    ``predict`` may be called from several threads at once on one model; each call gives the
    result a single-threaded call gives (docs/RELIABILITY.md). Changing the model (``add``,
    ``build``, ``set_weights``) while another thread predicts is not supported.

    Args:
        layers: the layers, in order.
        name: the model's name.

    Raises:
        ValueError: an element of ``layers`` is not a malinn layer.
    """

    def __init__(self, layers=None, name: str = "sequential"):
        self.name = name
        self.layers: list[Layer] = []
        self.input_shape: tuple | None = None   # one sample's shape, e.g. (784,) or (28, 28)
        self.source = None                      # the Keras file it came from, when converted
        self._build_lock = threading.RLock()    # a first predict from several threads builds once
        for layer in layers or []:
            self.add(layer)

    def add(self, layer: Layer) -> None:
        """Appends a layer.

        Raises:
            ValueError: ``layer`` is not a malinn layer, or its name is already used.
        """
        if not isinstance(layer, Layer):
            raise ValueError(f"Sequential {self.name!r}: expected a malinn layer, got {type(layer).__name__}")
        if any(existing.name == layer.name for existing in self.layers):
            raise ValueError(f"Sequential {self.name!r}: a layer named {layer.name!r} is already in the model")
        self.layers.append(layer)
        if self.input_shape is not None:
            self.build((None,) + self.input_shape)

    @property
    def input_dim(self) -> int | None:
        """Features per sample once flattened (``None`` before build)."""
        return None if self.input_shape is None else int(np.prod(self.input_shape))

    @property
    def built(self) -> bool:
        return self.input_shape is not None and all(layer.built for layer in self.layers)

    def build(self, input_shape) -> None:
        """Builds every layer for inputs of ``input_shape``, batch axis first: ``(None, 784)``.

        A sample may have several axes (``(None, 28, 28)``) when a ``Flatten`` comes before the
        first layer that needs one feature axis (Dense, BatchNormalization); element-wise layers
        may stand before it.

        Raises:
            ValueError: the shape has no batch axis or a size < 1, a built layer expects another
                width, or a Dense receives several axes.
        """
        shape = tuple(input_shape)
        if len(shape) < 2 or any(d is None or int(d) < 1 for d in shape[1:]):
            raise ValueError(f"Sequential {self.name!r}: input_shape must be (batch, features, ...) with sizes >= 1, "
                             f"got {input_shape!r}")
        sample = tuple(int(d) for d in shape[1:])
        if len(sample) > 1:
            for layer in self.layers:
                if getattr(layer, "flattens", False):
                    break
                if not getattr(layer, "elementwise", False):
                    raise ValueError(f"layer {layer.name!r} ({type(layer).__name__}) receives inputs of shape "
                                     f"{(None,) + sample}; malinn runs it on one feature axis only: put a Flatten "
                                     f"before it")
        self.input_shape = sample
        dim = self.input_dim
        for layer in self.layers:
            if layer.built and layer.input_dim is not None and layer.input_dim != dim:
                raise ValueError(f"layer {layer.name!r} was built for {layer.input_dim} input features, "
                                 f"but receives {dim}")
            if not layer.built:
                layer.build(dim)
            dim = layer.output_dim(dim)

    @property
    def output_dim(self) -> int:
        dim = self.input_dim
        for layer in self.layers:
            dim = layer.output_dim(dim)
        return dim

    # ---------------------------------------------------------------- inference
    def _check_input(self, x) -> np.ndarray:
        first = self.layers[0].name if self.layers else self.name
        try:
            array = np.asarray(x)
        except Exception as exc:  # ragged lists and the like
            raise ValueError(f"Input of layer {first!r} could not be read as an array: {exc}") from None
        if array.dtype.kind not in "biuf":
            raise ValueError(f"Input of layer {first!r} must be numeric, got dtype {array.dtype} "
                             f"with shape {array.shape}")
        if self.input_shape is not None:
            expected = "(None, " + ", ".join(map(str, self.input_shape)) + ("," if len(self.input_shape) == 1 else "") + ")"
            expected = expected.replace(",)", ")")
            ok = array.ndim == 1 + len(self.input_shape) and array.shape[1:] == self.input_shape
        else:
            expected, ok = "(None, features)", array.ndim >= 2
        if not ok:
            raise ValueError(f"Input of layer {first!r} is incompatible with the layer: expected shape {expected}, "
                             f"found shape {array.shape}")
        return array.astype(np.float32, copy=False)

    def predict(self, x, batch_size: int | None = None) -> np.ndarray:
        """Runs the model on ``x``.

        Args:
            x: a numeric array of shape ``(batch, features)``; float64 and integers are cast to
                float32 as Keras does.
            batch_size: samples per device pass (default: the whole batch in one pass, split
                further only where the device's largest allocation requires it; see
                :meth:`max_batch`). Results do not depend on it.

        Returns:
            A float32 array of shape ``(batch, units of the last layer)``.

        Raises:
            ValueError: ``x`` is not numeric, not 2-D, or its width differs from the model's
                input; ``batch_size`` is not a positive integer; the model has no layers.
            DeviceError: the device failed (out of memory, a failed launch), or even one sample's
                activations exceed its largest allocation; the message names the layer and shape.
        """
        if not self.layers:
            raise ValueError(f"Sequential {self.name!r} has no layers to predict with")
        x = self._check_input(x)
        self._ensure_built(x.shape[1:])
        x = x.reshape(x.shape[0], self.input_dim)   # Keras's Flatten order (row-major, channels last)
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer))
                                       or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        n = x.shape[0]
        if n == 0:
            return np.zeros((0, self.output_dim), dtype=np.float32)
        step = self._step(n, batch_size)
        outputs = [self._forward(x[start:start + step]) for start in range(0, n, step)]
        return outputs[0] if len(outputs) == 1 else np.concatenate(outputs, axis=0)

    def _step(self, n: int, batch_size=None) -> int:
        """Samples per pass: ``batch_size`` (default all ``n``), at most what fits on the device."""
        step = min(n, int(batch_size)) if batch_size else n
        return max(1, min(step, self.max_batch(limit=step)))

    def _ensure_built(self, sample_shape) -> None:
        with self._build_lock:
            if not self.built:
                self.build((None,) + tuple(sample_shape))

    # ---------------------------------------------------------------- memory planning
    def activation_bytes(self, batch: int, device: Device | None = None) -> tuple[int, str]:
        """The largest device buffer one pass of ``batch`` samples allocates for activations.

        Counts the input as uploaded, and for each Dense layer its input in the layout its kernel
        reads (a re-laid-out copy when it differs) and its result, each padded as the kernel
        declares. Element-wise layers work in place and allocate nothing.

        Args:
            batch: samples in the pass.
            device: the device (default: the current one).

        Returns:
            ``(bytes, what)``: the size and a description naming the layer and padded shape.
        """
        from . import ops
        from .layers.dense import Dense

        device = device or get_device()
        dim = self.input_dim
        worst = (0, "")
        if not (self.layers and isinstance(self.layers[0], Dense)):   # else the Dense's input covers it
            first = ops.kernel_for("matmul", device).matrices["b"].layout
            rows, cols = first.padded_shape(dim, batch)
            worst = (4 * rows * cols, f"the model's input ({dim} features x {batch} samples, padded to "
                                      f"{rows}x{cols} in {first})")
        for layer in self.layers:
            out = layer.output_dim(dim)
            if isinstance(layer, Dense):
                shape = (layer.units, dim, batch)
                spec = ops.kernel_for("matmul", device, shape)
                plan = ops.matmul_plan(spec, *shape)
                for key, label in (("b", "input"), ("r", "output")):
                    rows, cols = plan[key]
                    size = 4 * rows * cols
                    if size > worst[0]:
                        layout = spec.matrices[key].layout
                        logical = dim if key == "b" else layer.units
                        worst = (size, f"layer {layer.name!r} {label} ({logical} features x {batch} samples, "
                                       f"padded to {rows}x{cols} in {layout} for kernel {spec.codename})")
            dim = out
        return worst

    def max_batch(self, device: Device | None = None, limit: int | None = None) -> int:
        """The most samples one device pass may take, so that no activation buffer exceeds the
        device's largest single allocation (nor a quarter of its global memory: an input, a
        re-laid-out copy and a result can be alive at once, beside the weights).

        ``predict`` splits larger batches into passes of this many samples; results do not
        depend on the split.

        Args:
            device: the device (default: the current one).
            limit: stop searching at this many samples (default: 2**31).

        Returns:
            A positive number of samples.

        Raises:
            ValueError: the model is not built.
            DeviceError: even one sample's activations do not fit; the message names the layer,
                the padded shape and the device's limit.
        """
        if self.input_shape is None:
            raise ValueError(f"Sequential {self.name!r} is not built; call build(input_shape) first")
        device = device or get_device()
        budget = min(int(device.max_allocation), int(device.global_memory) // 4)
        limit = int(limit) if limit else 2**31
        # the common case without planning: kernels pad each dimension by less than _PAD_BOUND, so
        # this bounds every activation buffer (planning asks the kernel library, which takes time)
        widest = max([self.input_dim] + [layer.output_dim(d) for layer, d in self._layer_inputs()])
        if 4 * (widest + _PAD_BOUND) * (limit + _PAD_BOUND) <= budget // 2:
            return limit
        if self.activation_bytes(limit, device)[0] <= budget:
            return limit
        size, what = self.activation_bytes(1, device)
        if size > budget:
            raise DeviceError(f"{what} needs {size / 2**20:.1f} MiB, more than {device.name} allows in one "
                              f"allocation ({budget / 2**20:.1f} MiB): even one sample does not fit")
        low, high = 1, limit   # fits(low), not fits(high)
        while high - low > 1:
            mid = (low + high) // 2
            if self.activation_bytes(mid, device)[0] <= budget:
                low = mid
            else:
                high = mid
        return low

    def _layer_inputs(self):
        """(layer, its number of input features) for each layer, in order."""
        dim = self.input_dim
        for layer in self.layers:
            yield layer, dim
            dim = layer.output_dim(dim)

    def _forward(self, x: np.ndarray, every_layer: bool = False):
        get_device()  # fail early and clearly when no device works
        activations = DeviceMatrix.from_host(x.T)   # I = x^T: features x batch
        outputs = []
        for layer in self.layers:
            activations = layer.call(activations)
            if every_layer:
                outputs.append(np.ascontiguousarray(activations.numpy().T))
        return outputs if every_layer else np.ascontiguousarray(activations.numpy().T)

    def predict_layers(self, x) -> list:
        """Runs the model on ``x`` and returns every layer's output, for layer-by-layer checks.

        Args:
            x: as for :meth:`predict`.

        Returns:
            A list with one float32 ``(batch, features)`` array per layer, in order.
        """
        if not self.layers:
            raise ValueError(f"Sequential {self.name!r} has no layers to predict with")
        x = self._check_input(x)
        self._ensure_built(x.shape[1:])
        x = x.reshape(x.shape[0], self.input_dim)
        n = x.shape[0]
        if n == 0:
            dims, dim = [], self.input_dim
            for layer in self.layers:
                dim = layer.output_dim(dim)
                dims.append(np.zeros((0, dim), np.float32))
            return dims
        step = self._step(n)
        passes = [self._forward(x[start:start + step], every_layer=True) for start in range(0, n, step)]
        if len(passes) == 1:
            return passes[0]
        return [np.concatenate(outputs, axis=0) for outputs in zip(*passes)]

    def __call__(self, x) -> np.ndarray:
        return self.predict(x)

    # ---------------------------------------------------------------- weights and config
    def get_weights(self) -> list:
        """Every layer's weights, in order, in Keras's shapes."""
        return [w for layer in self.layers for w in layer.get_weights()]

    def set_weights(self, weights) -> None:
        """Sets every layer's weights from a flat list, as ``get_weights`` returns it.

        Raises:
            ValueError: the count or a shape does not match.
        """
        weights = list(weights)
        if not self.built:
            raise ValueError(f"Sequential {self.name!r} is not built; call build(input_shape) first")
        want = sum(len(layer.get_weights()) for layer in self.layers)
        if len(weights) != want:
            raise ValueError(f"Sequential {self.name!r} expects {want} weight arrays, got {len(weights)}")
        for layer in self.layers:
            count = len(layer.get_weights())
            layer.set_weights(weights[:count])
            weights = weights[count:]

    def save(self, path, target=None):
        """Writes a malinn model file (see :func:`malinn.saving.save_model`).

        Args:
            path: the destination; written atomically.
            target: a matmul codename or ``gpu``/``cpu``/``accelerator`` whose layouts the weights
                are stored in (default: the current device's kernel).

        Returns:
            The path written.

        Raises:
            ConversionError: the model is not built or the file cannot be written.
        """
        from .saving import save_model

        return save_model(self, path, target)

    def count_params(self) -> int:
        return sum(layer.count_params() for layer in self.layers)

    def get_config(self) -> dict:
        return {"name": self.name, "input_shape": list(self.input_shape) if self.input_shape else None,
                "layers": [{"class_name": type(l).__name__, "config": l.get_config()} for l in self.layers]}

    def summary(self, print_fn=print) -> str:
        """Prints (and returns) a table of layers, output shapes and parameter counts."""
        rows = [("Layer (type)", "Output Shape", "Param #")]
        dim = self.input_dim
        sample = self.input_shape
        for layer in self.layers:
            if getattr(layer, "flattens", False):
                sample = None
            if dim is not None:
                dim = layer.output_dim(dim)
            if sample is not None and len(sample) > 1 and getattr(layer, "elementwise", False):
                shape = "(None, " + ", ".join(map(str, sample)) + ")"
            else:
                shape = f"(None, {dim})" if dim is not None else "?"
            rows.append((f"{layer.name} ({type(layer).__name__})", shape, str(layer.count_params())))
        widths = [max(len(r[i]) for r in rows) + 2 for i in range(3)]
        line = "-" * sum(widths)
        out = [f'Model: "{self.name}"', line]
        for i, r in enumerate(rows):
            out.append("".join(c.ljust(w) for c, w in zip(r, widths)))
            if i == 0:
                out.append("=" * sum(widths))
        out += ["=" * sum(widths), f"Total params: {self.count_params()}", line]
        text = "\n".join(out)
        print_fn(text)
        return text
