"""Turns a :class:`KerasModel` (what a Keras file holds) into a malinn ``Sequential``.

Inference no-ops (Dropout and friends) are dropped; a BatchNormalization right after a linear Dense
is folded into that Dense's kernel and bias; every other supported layer becomes its malinn layer.
Every unsupported layer or activation is collected and reported in one ``ConversionError``.
"""

from __future__ import annotations

import numpy as np

from malinn.errors import ConversionError

from .model_spec import KerasModel

__all__ = ["to_sequential", "SUPPORTED_LAYERS", "SUPPORTED_ACTIVATIONS"]

NO_OPS = ("Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "GaussianNoise",
          "GaussianDropout", "AlphaDropout", "ActivityRegularization", "Identity", "InputLayer")
SUPPORTED_LAYERS = ("Dense", "Activation", "Flatten", "BatchNormalization", "ReLU", "LeakyReLU", "ELU",
                    "Softmax") + NO_OPS
#: Keras activation names -> malinn's (Keras 2 and 3 spell some differently).
SUPPORTED_ACTIVATIONS = {
    "linear": "linear", "relu": "relu", "relu6": "relu6", "sigmoid": "sigmoid", "tanh": "tanh",
    "softmax": "softmax", "elu": "elu", "selu": "selu", "softplus": "softplus", "softsign": "softsign",
    "swish": "swish", "silu": "swish", "gelu": "gelu", "exponential": "exponential",
    "leaky_relu": "leaky_relu", "hard_sigmoid": "hard_sigmoid", "hard_silu": "hard_swish",
    "hard_swish": "hard_swish", "mish": "mish",
}


def _activation_name(value) -> str | None:
    """The activation's name from a config value: a string, or Keras 3's serialized dict."""
    if value is None:
        return "linear"
    if isinstance(value, str):
        return value.rsplit(".", 1)[-1]
    if isinstance(value, dict):   # provenance.py has refused custom functions and classes
        if value.get("class_name") == "function" and isinstance(value.get("config"), str):
            return value["config"].rsplit(".", 1)[-1]
        if isinstance(value.get("class_name"), str):   # an activation object (a layer class)
            return value["class_name"]
    return None


def _map_activation(value, keras_major: int) -> str | None:
    name = _activation_name(value)
    mapped = SUPPORTED_ACTIVATIONS.get(name)
    if mapped == "hard_sigmoid" and keras_major == 2:
        return "hard_sigmoid_keras2"   # Keras 2: clip(0.2 x + 0.5, 0, 1); Keras 3: relu6(x + 3) / 6
    return mapped


def _last_axis(config, rank: int) -> bool:
    axis = config.get("axis", -1)
    axis = axis[0] if isinstance(axis, (list, tuple)) and len(axis) == 1 else axis
    return isinstance(axis, int) and axis in (-1, rank)


def to_sequential(km: KerasModel):
    """Builds the malinn model for ``km``.

    Args:
        km: a model read by :func:`malinn.converters.read_keras`.

    Returns:
        A built ``malinn.Sequential`` with the Keras weights set; each layer's ``keras_names``
        lists the Keras layers it stands for.

    Raises:
        ConversionError: unsupported layers or activations (all listed at once, with the
            supported ones), an input shape malinn cannot run, or inconsistent weights.
    """
    from malinn import Sequential, layers as L

    sample = _input_shape(km)
    unsupported = []
    plan = []            # (malinn layer, weights or None, keras names)
    flattened = len(sample) == 1
    for kl in km.layers:
        cfg = kl.config or {}
        cls = kl.class_name
        try:
            if cls in NO_OPS:
                if plan:
                    plan[-1][2].append(kl.name)
                continue
            if cls == "Dense":
                act = _map_activation(cfg.get("activation"), km.keras_major)
                if act is None:
                    unsupported.append(f"Dense {kl.name!r} with activation {_activation_name(cfg.get('activation'))!r}")
                    continue
                layer = L.Dense(int(cfg["units"]), activation=act, use_bias=bool(cfg.get("use_bias", True)), name=kl.name)
                plan.append([layer, list(kl.weights), [kl.name]])
            elif cls == "Activation":
                act = _map_activation(cfg.get("activation"), km.keras_major)
                if act is None:
                    unsupported.append(f"Activation {kl.name!r} with activation {_activation_name(cfg.get('activation'))!r}")
                    continue
                if act == "softmax" and not flattened:
                    unsupported.append(f"Activation {kl.name!r} (softmax) on multi-axis samples before a Flatten")
                    continue
                plan.append([L.Activation(act, name=kl.name), None, [kl.name]])
            elif cls == "ReLU":
                max_value = cfg.get("max_value")
                plan.append([L.ReLU(max_value=None if max_value is None else float(max_value),
                                    negative_slope=float(cfg.get("negative_slope", 0.0) or 0.0),
                                    threshold=float(cfg.get("threshold", 0.0) or 0.0), name=kl.name), None, [kl.name]])
            elif cls == "LeakyReLU":
                slope = cfg.get("negative_slope", cfg.get("alpha", 0.3))
                plan.append([L.LeakyReLU(float(slope), name=kl.name), None, [kl.name]])
            elif cls == "ELU":
                plan.append([L.ELU(float(cfg.get("alpha", 1.0)), name=kl.name), None, [kl.name]])
            elif cls == "Softmax":
                if not flattened:
                    unsupported.append(f"Softmax {kl.name!r} on multi-axis samples before a Flatten")
                    continue
                if not _last_axis(cfg, 1):
                    unsupported.append(f"Softmax {kl.name!r} over axis {cfg.get('axis')!r} (only the last axis)")
                    continue
                plan.append([L.Softmax(name=kl.name), None, [kl.name]])
            elif cls == "Flatten":
                if not flattened and cfg.get("data_format", "channels_last") == "channels_first":
                    unsupported.append(f"Flatten {kl.name!r} with data_format='channels_first'")
                    continue
                flattened = True
                plan.append([L.Flatten(name=kl.name), None, [kl.name]])
            elif cls == "BatchNormalization":
                if not _last_axis(cfg, 1 if flattened else len(sample)):
                    unsupported.append(f"BatchNormalization {kl.name!r} over axis {cfg.get('axis')!r} (only the last axis)")
                    continue
                _add_batch_norm(plan, kl, cfg, sample, flattened, L)
            else:
                unsupported.append(f"{cls} {kl.name!r}")
        except (KeyError, TypeError, ValueError) as exc:
            raise ConversionError(f"{km.source}: layer {kl.name!r} ({cls}) has a config malinn cannot use: {exc}") from None
    if unsupported:
        raise ConversionError(
            f"{km.source}: {len(unsupported)} unsupported layer(s): {'; '.join(unsupported)}. "
            f"Supported layers: {', '.join(SUPPORTED_LAYERS)}. "
            f"Supported activations: {', '.join(sorted(SUPPORTED_ACTIVATIONS))}.")
    if not plan:
        raise ConversionError(f"{km.source}: the model has no layer that computes anything")
    model = Sequential(name=km.name or "sequential")
    for layer, _, names in plan:
        layer.keras_names = tuple(names)
        model.add(layer)
    try:
        model.build((None,) + sample)
        for layer, weights, _ in plan:
            if weights is not None:
                layer.set_weights(weights)
    except ValueError as exc:
        raise ConversionError(f"{km.source}: {exc}") from None
    model.source = {"file": str(km.source), "format": km.format, "keras_version": km.keras_version}
    return model


def _add_batch_norm(plan, kl, cfg, sample, flattened, L):
    """Folds a BatchNormalization into a preceding linear Dense, or adds it as its own layer."""
    center, scale = bool(cfg.get("center", True)), bool(cfg.get("scale", True))
    bn = L.BatchNormalization(epsilon=float(cfg.get("epsilon", 1e-3)), center=center, scale=scale, name=kl.name)
    weights = [np.asarray(w, np.float32) for w in kl.weights]
    previous = plan[-1] if plan else None
    if previous is not None and isinstance(previous[0], L.Dense) and previous[0].activation == "linear":
        dense, dense_weights, names = previous
        bn.set_weights(weights)
        s, t = bn.scale_shift()                                   # y = x * s + t per unit
        s64, t64 = s.astype(np.float64), t.astype(np.float64)
        kernel = dense_weights[0].astype(np.float64) * s64
        bias = (dense_weights[1].astype(np.float64) if dense.use_bias else 0.0) * s64 + t64
        folded = L.Dense(dense.units, activation="linear", use_bias=True, name=dense.name)
        previous[0] = folded
        previous[1] = [kernel.astype(np.float32), bias.astype(np.float32)]
        names.append(kl.name)
        return
    if not flattened and len(sample) > 1:
        # per-channel parameters over a (..., C) sample, flattened row-major: feature f is channel f % C
        repeat = int(np.prod(sample[:-1]))
        weights = [np.tile(w, repeat) for w in weights]
        bn.elementwise = True
    plan.append([bn, weights, [kl.name]])


def _input_shape(km: KerasModel) -> tuple:
    shape = km.input_shape
    if shape is None or any(d is None for d in shape):
        first_dense = next((l for l in km.layers if l.class_name == "Dense" and l.weights), None)
        if shape is not None and len(shape) > 1 or first_dense is None:
            raise ConversionError(f"{km.source}: the model's input shape {shape!r} is not fully known; "
                                  "malinn needs every axis but the batch to be fixed")
        return (int(first_dense.weights[0].shape[0]),)
    return tuple(int(d) for d in shape)
