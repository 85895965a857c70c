"""The layer contract, as in Keras, and the one registry of layer classes.

``__init__`` validates its arguments, ``build(input_shape)`` makes the weights for an input shape
(batch axis first, ``None`` for it), ``compute_output_shape`` gives the output shape,
``get_config`` returns what ``__init__`` needs to make the layer again, ``get_weights`` /
``set_weights`` move weights in Keras's shapes and order, ``save_own_variables`` /
``load_own_variables`` write and read them in a model file, and ``lower(builder, x)`` records the
steps that compute the layer in a plan (:class:`malinn.plan.builder.PlanBuilder`).

Every subclass is registered under its class name (:mod:`malinn.registry`): saving, loading, the
converter and the CLI find classes there, never by ``isinstance`` chains. A subclass that converts
Keras layers (it declares ``keras_config_keys`` or its own ``from_keras_config``) is registered under
each Keras class name it stands for too (:mod:`malinn.layers.keras_config`).
"""

from __future__ import annotations

import functools
import itertools
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from ..plan.tensor import format_shape
from ..registry import register
from .input_layer import call_layer
from .keras_config import SIZE_KEYS, KerasContext, NotConvertible, keras_activation

if TYPE_CHECKING:
    from ..library.kernel_library import KernelSpec
    from ..plan.builder import PlanBuilder
    from ..plan.tensors import Value

__all__ = [
    "Layer",
    "sample_shape",
    "glorot_uniform",
    "weights_to_be_loaded",
    "numeric_weights",
    "zeros",
    "ones",
    "placeholders",
]

_counters: dict = {}
_counter_lock = threading.Lock()
_loading = threading.local()


@contextmanager
def weights_to_be_loaded():
    """Within it (in this thread), a layer's ``build`` makes its weights as placeholders (see
    :func:`zeros`), not arrays: for a caller that replaces every weight right after ``build``
    (loading a model file, converting a Keras file), where a random draw is thrown away (for Full
    CIFAR's 25 M weights, about a third of a second) and where a file's config may declare weights
    far larger than the file holds (a 3000 x 3000 convolution kernel: 2.6 GB before its shape was
    refused); :func:`placeholders` names those a caller left unreplaced."""
    previous = getattr(_loading, "active", False)
    _loading.active = True
    try:
        yield
    finally:
        _loading.active = previous


def _read_only(value: float) -> np.ndarray:
    array = np.full((), value, np.float32)
    array.flags.writeable = False
    return array


#: the one value each placeholder weight shows
_PLACEHOLDER_VALUES = {value: _read_only(value) for value in (0.0, 1.0)}


def zeros(shape: int | Sequence[int]) -> np.ndarray:
    """A float32 array of ``shape`` holding zeros, for a layer's initial weight; inside
    :func:`weights_to_be_loaded` a read-only placeholder: one value seen at every index, which takes
    no memory whatever the shape.

    Raises:
        ValueError: inside :func:`weights_to_be_loaded`, a shape with more values than numpy can
            index (a config declaring sizes no array can have).
    """
    return _initial(shape, 0.0)


def ones(shape: int | Sequence[int]) -> np.ndarray:
    """As :func:`zeros`, holding ones."""
    return _initial(shape, 1.0)


def _initial(shape: int | Sequence[int], value: float) -> np.ndarray:
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)  # a size as numpy takes it
    if getattr(_loading, "active", False):
        try:
            return np.broadcast_to(_PLACEHOLDER_VALUES[value], shape)
        except ValueError:  # numpy's "iterator is too large"
            raise ValueError(f"a weight of shape {tuple(shape)} has more values than an array can hold") from None
    return np.zeros(shape, np.float32) if value == 0.0 else np.ones(shape, np.float32)


def placeholders(layer: Layer) -> list:
    """The names of ``layer``'s weights that are still the placeholders :func:`zeros` and
    :func:`ones` made (no file's value replaced them)."""
    return [
        name
        for name in layer.weight_names
        if isinstance(getattr(layer, name, None), np.ndarray)
        and any(getattr(layer, name).base is value for value in _PLACEHOLDER_VALUES.values())
    ]


def glorot_uniform(shape: int | Sequence[int], fan_in: int, fan_out: int) -> np.ndarray:
    """Float32 weights of ``shape`` drawn uniformly from +-sqrt(6 / (fan_in + fan_out)) (Keras's
    default kernel initializer); placeholder zeros inside :func:`weights_to_be_loaded`."""
    if getattr(_loading, "active", False):
        return zeros(shape)
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return np.random.default_rng().uniform(-limit, limit, shape).astype(np.float32)


def _auto_name(prefix: str) -> str:
    with _counter_lock:
        counter = _counters.setdefault(prefix, itertools.count())
        i = next(counter)
    return prefix if i == 0 else f"{prefix}_{i}"


def _snake(name: str) -> str:
    """A class name as Keras names its layers: ``Dense`` dense, ``Conv2D`` conv2d, ``ReLU`` re_lu,
    ``GlobalMaxPooling2D`` global_max_pooling2d (an underscore before each capitalised word, and
    between a lower-case letter and a capital)."""
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()


def _numpy_max_dims() -> int:
    """The most axes a numpy array may have (64 from numpy 2, 32 before)."""
    for dims in (64, 32):
        try:
            np.empty((1,) * dims, np.float32)
            return dims
        except ValueError:
            continue
    return 32


#: the most axes a sample may have besides the batch's: a batch of more could never be given to
#: predict (numpy holds arrays of at most :func:`_numpy_max_dims` axes)
MAX_SAMPLE_AXES = _numpy_max_dims() - 1


def sample_shape(input_shape: Any, who: str) -> tuple:
    """``input_shape`` without its batch axis, every size a positive integer.

    Raises:
        ValueError: the shape has no batch axis, a size that is not a positive integer, or more
            than :data:`MAX_SAMPLE_AXES` axes besides the batch's.
    """
    try:
        shape = tuple(input_shape)
    except TypeError:
        raise ValueError(f"{who}: input_shape must be a tuple (batch, ...), got {input_shape!r}") from None
    if len(shape) - 1 > MAX_SAMPLE_AXES:
        raise ValueError(
            f"{who}: input_shape has {len(shape) - 1} axes besides the batch's; a batch of such samples "
            f"could never be given (numpy arrays have at most {MAX_SAMPLE_AXES + 1} axes, the batch's "
            f"and {MAX_SAMPLE_AXES} more)"
        )
    if len(shape) < 2 or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1 for d in shape[1:]):
        raise ValueError(f"{who}: input_shape must be (batch, d1, ...) with sizes >= 1, got {input_shape!r}")
    return tuple(int(d) for d in shape[1:])


def numeric_weights(weights: Iterable[Any], who: str) -> list:
    """``weights`` as float32 arrays, each checked to hold numbers (booleans, integers or floats).

    Raises:
        ValueError: an array holds something else (``None``, strings, complex numbers), naming
            ``who``, the array's place and its dtype (numpy would make NaN of a ``None`` and drop
            an imaginary part with a warning).
    """
    arrays = [np.asarray(w) for w in weights]
    for i, a in enumerate(arrays):
        if a.dtype.kind not in "biuf":
            raise ValueError(f"{who}: weight array {i} holds {a.dtype} values of shape {a.shape}; expected numbers")
    return [a.astype(np.float32, copy=False) for a in arrays]


def folded_affine(kernel: Any, bias: Any, scale: Any, shift: Any, kernel_scale: Any = None) -> tuple:
    """A per-output ``y * scale + shift`` (a BatchNormalization after a linear layer) folded into
    that layer's weights: ``(kernel * scale, bias * scale + shift)``, computed in float64 and
    returned as float32. ``bias`` None counts as zero; ``kernel_scale`` is ``scale`` shaped for the
    kernel where its output axis is not the last (default: ``scale``)."""
    s64, t64 = np.asarray(scale, np.float64), np.asarray(shift, np.float64)
    ks = s64 if kernel_scale is None else np.asarray(kernel_scale, np.float64)
    folded_bias = (np.asarray(bias, np.float64) if bias is not None else 0.0) * s64 + t64
    return (np.asarray(kernel, np.float64) * ks).astype(np.float32), folded_bias.astype(np.float32)


#: a layer's attributes that say nothing of what it computes (its name, its build state, the device
#: copies and the version that :meth:`Layer.__setattr__` keeps)
_BOOKKEEPING = frozenset({"name", "built", "input_shape", "keras_names", "device_copies", "version"})


def _building(build: Callable[..., None]) -> Callable[..., None]:
    """``build`` marking the layer as building while it runs (its weights take new shapes then)."""

    @functools.wraps(build)
    def building(self: Layer, input_shape: Any, *args: Any, **kwargs: Any) -> None:
        depth = self.__dict__.get("_building", 0)
        object.__setattr__(self, "_building", depth + 1)
        try:
            return build(self, input_shape, *args, **kwargs)
        finally:
            object.__setattr__(self, "_building", depth)

    return building


def write_weights(store: Any, name: str, data: Any) -> Any:
    """Writes ``data`` as dataset ``name`` of the HDF5 group ``store`` with HDF5's Fletcher-32
    checksum where the array has values (a board's flash that flips a bit under a model file is then
    a damaged file when read, not a weight of 1e38 used silently); returns the dataset."""
    data = np.asarray(data)
    checked = data.ndim > 0 and data.size > 0
    return store.create_dataset(name, data=data, fletcher32=checked)


class Layer:
    """Base class of malinn layers.

    Args:
        name: the layer's name (default: the class name in snake case, numbered like Keras).

    Raises:
        ValueError: ``name`` is not a non-empty string.
    """

    #: whether a built layer computes right on samples of another shape with the same last axis
    #: (a Dense or a convolution shared by inputs of two sizes, as Keras allows): its weights and
    #: kernels follow the input's last axis alone, and its plan steps read the input's own shape.
    #: False where the weights or axes are laid out for the shape it was built for.
    reusable_on_other_shapes = False
    #: the attributes that hold the layer's weights (``("kernel", "bias")``): each is stored as a
    #: read-only float32 copy, and a built layer's keeps its shape (see :meth:`__setattr__`)
    weight_names: tuple = ()
    #: Keras class names this class converts besides its own, declared by the class itself (a
    #: subclass converts its own name alone): another generation's spelling, a layer that computes
    #: the same at inference
    keras_aliases: tuple = ()
    #: the keys of a Keras config that the constructor takes as they are (sizes as tuples, the
    #: activation by malinn's name: :meth:`from_keras_config`); None where the class converts by a
    #: ``from_keras_config`` of its own, or not at all
    keras_config_keys: tuple | None = None
    #: Keras class names this class would stand for but that the converter refuses, each with why
    #: (listed after the layer's class and name), declared by the class itself
    keras_refused: dict = {}
    #: of the Keras classes it converts, those whose call with ``training=True`` computes otherwise in
    #: Keras's predict (random, or the batch's statistics): the converter refuses such a call
    keras_training_dependent: tuple = ()
    #: whether the Keras layers this class converts compute nothing at inference: the converter passes
    #: their input on (and makes a layer only for a model of nothing else)
    keras_no_op: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register("layer", cls)
        if not cls.__name__.startswith("_") and cls.converts_keras():
            for keras_name in (
                cls.__name__,
                *cls.__dict__.get("keras_aliases", ()),
                *cls.__dict__.get("keras_refused", {}),
            ):
                register("keras", cls, keras_name)
        if "build" in cls.__dict__:  # while it builds, a layer makes its weights in their new shapes
            setattr(cls, "build", _building(cls.__dict__["build"]))  # its build wrapped

    def __init__(self, name: str | None = None):
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"{type(self).__name__}: name must be a non-empty string, got {name!r}")
        self.name = name or _auto_name(_snake(type(self).__name__))
        self.built = False
        self.input_shape: tuple | None = None  # one sample's shape, without the batch axis
        #: names of the Keras layers this layer stands for (set by the converter; for verify)
        self.keras_names: tuple = ()
        #: device copies of the weights, shared by every plan; cleared when the weights change
        self.device_copies: dict = {}
        #: bumped whenever the weights change, so models know their plans are stale
        self.version = 0

    def __setattr__(self, name: str, value: Any) -> None:
        """Sets an attribute; on a built layer, a weight or an option assigned (``dense.kernel =
        ...``, ``dense.activation = ...``) makes the models' plans stale, as :meth:`set_weights`
        does (a plan already made would keep the old values).

        A weight (:attr:`weight_names`) is stored as a read-only float32 copy: changing the array
        in place (``dense.kernel[0] = 1``) raises, where the device kept the values it had uploaded.

        Raises:
            ValueError: a weight of a built layer assigned in another shape than its own, or not
                numeric.
        """
        if name in self.weight_names and value is not None:
            value = self._weight_array(name, value)
        object.__setattr__(self, name, value)
        if name[0] != "_" and name not in _BOOKKEEPING and self.__dict__.get("built"):
            self._weights_changed()

    def __setstate__(self, state: dict) -> None:
        """A copy (``copy.deepcopy``, ``pickle``) holds its weights read-only too."""
        self.__dict__.update(state)
        for name in self.weight_names:
            if isinstance(state.get(name), np.ndarray):
                state[name].flags.writeable = False

    def _weight_array(self, name: str, value: Any) -> np.ndarray:
        """``value`` as the read-only float32 array weight ``name`` holds (its shape kept)."""
        try:  # built to be loaded, a layer's placeholders are kept as they are (no memory) until the file's
            # weights replace them (a file whose config declares more than its weights costs no memory)
            loading = self.__dict__.get("_building") and getattr(_loading, "active", False)
            array = np.asarray(value, dtype=np.float32) if loading else np.array(value, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"layer {self.name!r} ({type(self).__name__}): {name} must be numeric: {exc}") from None
        old = self.__dict__.get(name)
        if (
            self.__dict__.get("built")
            and not self.__dict__.get("_building")
            and isinstance(old, np.ndarray)
            and array.shape != old.shape
        ):
            raise ValueError(
                f"layer {self.name!r} ({type(self).__name__}): {name} has shape {old.shape}, got {array.shape}"
            )
        array.flags.writeable = False
        return array

    # ---------------------------------------------------------------- Keras's contract
    def build(self, input_shape: Any) -> None:
        """Creates the layer's weights for inputs of ``input_shape`` (batch axis first)."""
        self.input_shape = sample_shape(input_shape, f"layer {self.name!r}")
        self.built = True
        self._weights_changed()

    def compute_output_shape(self, input_shape: Any) -> tuple:
        """The output shape for ``input_shape`` (both with the batch axis first)."""
        return tuple(input_shape)

    def check_reuse(self, input_shape: Sequence[int | None], how: str = "receives") -> None:
        """Checks that this layer, built, can compute on inputs of ``input_shape`` (batch axis first).

        Raises:
            ValueError: the last axis differs from the one it was built for, or another shape where
                its weights or axes are laid out for the first (:attr:`reusable_on_other_shapes`).
        """
        sample = tuple(input_shape)[1:]
        if not self.built or self.input_shape is None or sample == tuple(self.input_shape):
            return
        built = (
            f"{type(self).__name__} {self.name!r} was built for inputs of shape "
            f"{format_shape((None,) + tuple(self.input_shape))}"
        )
        if sample[-1:] != tuple(self.input_shape[-1:]):
            raise ValueError(f"{built}, but {how} {format_shape(input_shape)}")
        if not self.reusable_on_other_shapes:
            raise ValueError(
                f"{built}, but {how} {format_shape(input_shape)}: its weights and axes are laid out for "
                f"the first shape (a layer of this kind is not shared by inputs of two shapes)"
            )

    def lower(self, builder: PlanBuilder, x: Any) -> Value:
        """Records the steps computing this layer on ``x`` in ``builder``; returns the output value."""
        raise NotImplementedError(f"{type(self).__name__} does not say how it runs")

    def count_params(self) -> int:
        return sum(int(w.size) for w in self.weight_arrays())

    def kernel_matrices(self) -> dict:
        """``{index in get_weights(): (name, matrix)}``: each weight a reduced precision stores, as
        the matrix the plan uploads (rows = output channels, the rows int8-weights scales); the rest
        (biases, normalization vectors, PReLU's alpha) stay float32. None here."""
        return {}

    def precision_weights(self) -> dict:
        """``{name: matrix}`` of :meth:`kernel_matrices` (none before the layer is built)."""
        return {name: matrix for name, matrix in self.kernel_matrices().values()} if self.built else {}

    def summary_label(self) -> str:
        """``name (Type)`` for a model's summary, with the Keras layers the converter folded into
        this one (``dense (Dense) + batch_normalization (folded)``: their parameters are in this
        layer's now, so the total is below Keras's)."""
        folded = [name for name in self.keras_names if name != self.name]
        return f"{self.name} ({type(self).__name__})" + (f" + {' + '.join(folded)} (folded)" if folded else "")

    def weight_arrays(self) -> list:
        """The layer's weights themselves (read-only arrays, in :meth:`get_weights`'s order): what
        its plans upload and its file holds, without a copy."""
        if not self.built:
            return []
        if not self.weight_names:  # a layer written with its own get_weights (before weight_names)
            return [] if type(self).get_weights is Layer.get_weights else list(self.get_weights())
        return [w for w in (getattr(self, name, None) for name in self.weight_names) if w is not None]

    def get_weights(self) -> list:
        """The layer's weights as numpy arrays (copies), in Keras's shapes and order."""
        return [w.copy() for w in self.weight_arrays()]

    def set_weights(self, weights: Iterable[Any]) -> None:
        """Replaces the layer's weights; shapes must equal :meth:`get_weights`'s."""
        if list(weights):
            raise ValueError(f"layer {self.name!r} ({type(self).__name__}) has no weights, got {len(list(weights))}")

    def get_config(self) -> dict:
        return {"name": self.name}

    @classmethod
    def from_config(cls, config: dict) -> "Layer":
        return cls(**config)

    def __call__(self, inputs):
        """Calls the layer on a symbolic tensor (or a list of them, for a merge layer) to build a
        Functional model, as in Keras: ``y = Dense(4)(malinn.Input((8,)))``.

        Returns:
            The output :class:`~malinn.layers.input_layer.KerasTensor`.

        Raises:
            ValueError: ``inputs`` are not symbolic tensors, or their shape does not fit the layer.
        """
        return call_layer(self, inputs)

    # ---------------------------------------------------------------- model files
    def save_own_variables(self, store: Any, target: KernelSpec) -> None:
        """Writes the layer's weights into ``store`` (an HDF5 group) for the matmul kernel ``target``."""
        for i, weight in enumerate(self.weight_arrays()):
            write_weights(store, str(i), weight)

    def load_own_variables(self, store: Any) -> None:
        """Reads what :meth:`save_own_variables` wrote."""
        self.set_weights([np.asarray(store[str(i)][()], np.float32) for i in range(len(store))])

    # ---------------------------------------------------------------- conversion
    @classmethod
    def converts_keras(cls) -> bool:
        """Whether the class converts Keras layers: it declares :attr:`keras_config_keys` or a
        :meth:`from_keras_config` of its own."""
        own = getattr(cls.from_keras_config, "__func__")  # the classmethod's function (a subclass's own or Layer's)
        return cls.keras_config_keys is not None or own is not getattr(Layer.from_keras_config, "__func__")

    @classmethod
    def from_keras_config(cls, config: dict, keras: KerasContext) -> "Layer":
        """The layer a Keras layer's saved ``config`` describes (``keras``: its class, the name to
        take, the Keras generation, the input shape). This one passes on the keys of
        :attr:`keras_config_keys` that the config holds; a class whose values need mapping has its own.

        Raises:
            NotConvertible: no malinn layer computes what the config asks (an activation malinn lacks).
            ValueError: a value the constructor refuses.
        """
        if cls.keras_config_keys is None:
            raise NotConvertible("")
        kwargs = {key: config[key] for key in cls.keras_config_keys if key in config}
        if "activation" in kwargs:
            kwargs["activation"] = keras_activation(kwargs["activation"], keras)
        for key in SIZE_KEYS:
            if isinstance(kwargs.get(key), list):
                kwargs[key] = tuple(kwargs[key])
        return cls(name=keras.name, **kwargs)

    @classmethod
    def from_keras_time_distributed(cls, config: dict, keras: KerasContext) -> "Layer | None":
        """The layer that computes Keras's ``TimeDistributed`` of this one (of ``config``) on the
        ``(batch, time, ...)`` input ``keras.input_shape``: this layer with its axes shifted by one,
        where it computes each time step so; None where none does (here).

        Raises:
            NotConvertible: as :meth:`from_keras_config`.
        """
        return None

    def from_keras_weights(self, weights: list) -> list:
        """The weights a Keras file holds for this layer (built), as :meth:`set_weights` takes them."""
        return list(weights)

    def absorb_affine(self, scale: np.ndarray, shift: np.ndarray) -> bool:
        """Folds a following per-feature ``y * scale + shift`` into this layer when that is exact.

        Returns:
            Whether it was folded (a linear Dense can; most layers cannot).
        """
        return False

    # ---------------------------------------------------------------- shared steps
    def _weights_changed(self) -> None:
        # a new dict, not the old one cleared: an upload of the old weights still under way (another
        # thread's plan) finishes into the old dict, which no plan made from now on reads
        self.device_copies = {}
        self.version += 1

    def _what(self) -> str:
        return f"layer {self.name!r}"

    def _built_shape(self) -> tuple:
        """:attr:`input_shape` of the built layer."""
        assert self.input_shape is not None, f"{self._what()} is not built"
        return self.input_shape

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r}>"
