"""Checks that the weights read from a file fit the layers' configs (and names are unique).

Only layers whose weights Keras defines precisely are checked (Dense, BatchNormalization), and
the feature widths are followed along the chain through layers whose output shape is known;
any other layer stops the width check without failing. Nothing here decides which layers malinn
supports.
"""

from __future__ import annotations

import math

from malinn.errors import ConversionError
from malinn.layers.shaping import KERAS_AUGMENTATIONS

from .model_spec import KerasLayer, KerasModel

#: Keras's random augmentation layers, which return their input at inference (the layer that stands
#: for them declares them: :class:`malinn.layers.Identity`)
AUGMENTATIONS = KERAS_AUGMENTATIONS

#: Layers without weights whose output shape equals their input shape (at inference).
SHAPE_PRESERVING = frozenset(AUGMENTATIONS) | frozenset(
    {
        "Activation",
        "Dropout",
        "AlphaDropout",
        "GaussianDropout",
        "GaussianNoise",
        "SpatialDropout1D",
        "SpatialDropout2D",
        "SpatialDropout3D",
        "ActivityRegularization",
        "ReLU",
        "LeakyReLU",
        "ELU",
        "Softmax",
        "ThresholdedReLU",
        "PReLU",
        "Identity",
        "LayerNormalization",
        "UnitNormalization",
        "Masking",
    }
)


def _fail(model: KerasModel, layer: KerasLayer, message: str) -> ConversionError:
    return ConversionError(f"{model.source}: layer {layer.name!r} ({layer.class_name}): {message}")


def _flag(config: dict, key: str, default: bool = True) -> bool:
    value = config.get(key, default)
    return bool(default if value is None else value)


def check_model(model: KerasModel) -> None:
    """Raise :class:`ConversionError` when a weight's count or shape contradicts the config."""
    seen = set()
    for layer in model.layers:
        if layer.name in seen:
            raise ConversionError(f"{model.source}: two layers are named {layer.name!r}")
        seen.add(layer.name)
    # without the batch dimension; None when unknown (a graph's layers are not one chain of widths)
    shape = model.input_shape if model.graph is None else None
    for layer in model.layers:
        shape = _check_layer(model, layer, shape)


def _known_last(shape):
    if shape is None or len(shape) == 0:
        return None
    return shape[-1]


def _check_layer(model: KerasModel, layer: KerasLayer, shape: tuple | None) -> tuple | None:
    kind = layer.class_name
    if kind == "Dense":
        return _check_dense(model, layer, shape)
    if kind == "BatchNormalization":
        _check_batchnorm(model, layer, shape)
        return shape
    if kind == "Flatten":
        if shape is None or any(d is None for d in shape):
            return None
        return (math.prod(shape),)
    if kind in SHAPE_PRESERVING:
        return shape
    return None


def _check_dense(model: KerasModel, layer: KerasLayer, shape: tuple | None) -> tuple | None:
    cfg = layer.config
    units = cfg.get("units")
    if not isinstance(units, int) or isinstance(units, bool) or units < 1:
        raise _fail(model, layer, f"its config has no valid 'units' (got {units!r})")
    use_bias = _flag(cfg, "use_bias")
    expected = 2 if use_bias else 1
    if len(layer.weights) != expected:
        what = "kernel and bias" if use_bias else "kernel (use_bias is false)"
        hint = " (was the model saved before it was built?)" if not layer.weights else ""
        raise _fail(
            model,
            layer,
            f"expected {expected} weight arrays ({what}), the file has {len(layer.weights)}{hint}",
        )
    kernel = layer.weights[0]
    if kernel.ndim != 2 or kernel.shape[1] != units:
        raise _fail(
            model,
            layer,
            f"kernel has shape {tuple(kernel.shape)} but the config says units={units} "
            f"(expected (in_features, {units}))",
        )
    if use_bias and tuple(layer.weights[1].shape) != (units,):
        raise _fail(
            model,
            layer,
            f"bias has shape {tuple(layer.weights[1].shape)} but the config says units={units}",
        )
    in_features = kernel.shape[0]
    last = _known_last(shape)
    if last is not None and last != in_features:
        raise _fail(
            model,
            layer,
            f"kernel has shape {tuple(kernel.shape)}, so it takes {in_features} features, "
            f"but the layer before it gives {last}",
        )
    build = None
    raw_build = cfg.get("batch_input_shape") or cfg.get("batch_shape")
    if isinstance(raw_build, list) and raw_build and isinstance(raw_build[-1], int):
        build = raw_build[-1]
    if build is not None and build != in_features:
        raise _fail(
            model,
            layer,
            f"kernel has shape {tuple(kernel.shape)} but the config's input shape ends in {build}",
        )
    if shape is None:
        return None
    return tuple(shape[:-1]) + (units,)


def _check_batchnorm(model: KerasModel, layer: KerasLayer, shape: tuple | None) -> None:
    cfg = layer.config
    center, scale = _flag(cfg, "center"), _flag(cfg, "scale")
    names = (
        (["gamma"] if scale else [])
        + (["beta"] if center else [])
        + [
            "moving_mean",
            "moving_variance",
        ]
    )
    if len(layer.weights) != len(names):
        raise _fail(
            model,
            layer,
            f"expected {len(names)} weight arrays ({', '.join(names)}; center={center}, "
            f"scale={scale}), the file has {len(layer.weights)}",
        )
    axis = cfg.get("axis", -1)
    if isinstance(axis, list) and len(axis) > 1:  # tf_keras takes several axes (one statistic per pair)
        raise _fail(
            model,
            layer,
            f"BatchNormalization over several axes (axis={axis}) is not supported; malinn normalizes over one axis",
        )
    sizes = {tuple(w.shape) for w in layer.weights}
    if len(sizes) != 1 or len(next(iter(sizes))) != 1:
        got = ", ".join(f"{n} {tuple(w.shape)}" for n, w in zip(names, layer.weights))
        raise _fail(model, layer, f"its weights must be vectors of one length; got {got}")
    size = next(iter(sizes))[0]
    if isinstance(axis, list) and len(axis) == 1:
        axis = axis[0]
    if shape is None or not isinstance(axis, int) or isinstance(axis, bool):
        return
    full = (None,) + tuple(shape)  # Keras's axis counts the batch dimension.
    if not -len(full) <= axis < len(full):
        raise _fail(model, layer, f"axis {axis} is out of range for input shape {tuple(shape)}")
    width = full[axis]
    if width is not None and width != size:
        raise _fail(
            model,
            layer,
            f"its weights have length {size} but the input has {width} features on axis {axis}",
        )
