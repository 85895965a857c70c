"""Turns a :class:`KerasModel` (what a Keras file holds) into a malinn ``Sequential`` (a chain) or
``Functional`` (any other graph: merges, shared layers, several inputs and outputs).

Inference no-ops (Dropout and friends, the random augmentation layers) are dropped (a model of nothing else becomes one Identity);
a per-feature affine layer on the last axis (BatchNormalization, Rescaling, Normalization) right
after a linear Dense is folded into that Dense's kernel and bias (the layer's ``absorb_affine``), one
that only scales (no shift) right before a Dense into that Dense's kernel (``absorb_input_affine``);
``TimeDistributed(layer)`` becomes the layer itself on the wider input (its axes shifted by one);
every other supported layer becomes the malinn layer of the same class name (:mod:`malinn.registry`).
Every unsupported layer or activation is collected and reported in one ``ConversionError``.
"""

from __future__ import annotations

import numpy as np

from malinn.errors import ConversionError
from malinn.layers.base import placeholders, weights_to_be_loaded
from malinn.plan.tensor import format_shape
from malinn.registry import lookup

from .dtypes import FLOAT_POLICIES, policy_problem
from .model_spec import KerasModel
from .validate import AUGMENTATIONS

__all__ = ["to_model", "SUPPORTED_LAYERS", "SUPPORTED_ACTIVATIONS"]

NO_OPS = ("Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "GaussianNoise",
          "GaussianDropout", "AlphaDropout", "ActivityRegularization", "Identity", "InputLayer") + AUGMENTATIONS
#: the layers whose output a call with ``training=True`` changes in Keras's predict (random, or the
#: batch's statistics); any other layer computes the same either way
TRAINING_DEPENDENT = frozenset(NO_OPS) - {"InputLayer", "Identity", "ActivityRegularization"} | {"BatchNormalization"}
MERGES = ("Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum", "Concatenate", "Dot")
#: Keras window layers (channels last) -> the config keys passed on to the malinn layer of that name
#: ("activation" is mapped to malinn's name): every argument of Keras 3's layer that changes what it
#: computes (``data_format`` included, which the malinn layer refuses unless ``channels_last``), so
#: that none is dropped silently; tests/converters/test_convert_errors.py checks them against Keras.
WINDOW_LAYERS = {
    "Conv1D": ("filters", "kernel_size", "strides", "padding", "dilation_rate", "groups", "activation", "use_bias",
               "data_format"),
    "Conv2D": ("filters", "kernel_size", "strides", "padding", "dilation_rate", "groups", "activation", "use_bias",
               "data_format"),
    "DepthwiseConv2D": ("kernel_size", "strides", "padding", "depth_multiplier", "dilation_rate", "activation",
                        "use_bias", "data_format"),
    "SeparableConv2D": ("filters", "kernel_size", "strides", "padding", "depth_multiplier", "dilation_rate",
                        "activation", "use_bias", "data_format"),
    **{name: ("pool_size", "strides", "padding", "data_format")
       for name in ("MaxPooling1D", "MaxPooling2D", "AveragePooling1D", "AveragePooling2D")},
    **{name: ("keepdims", "data_format") for name in ("GlobalMaxPooling1D", "GlobalMaxPooling2D",
                                                       "GlobalAveragePooling1D", "GlobalAveragePooling2D")},
    "ZeroPadding1D": ("padding", "data_format"), "ZeroPadding2D": ("padding", "data_format"),
    "Cropping1D": ("cropping",), "Cropping2D": ("cropping", "data_format"),
    "UpSampling1D": ("size",), "UpSampling2D": ("size", "data_format", "interpolation"),
}
SUPPORTED_LAYERS = ("Dense", "Activation", "Flatten", "BatchNormalization", "ReLU", "LeakyReLU", "ELU",
                    "Softmax", "ThresholdedReLU", "PReLU", "LayerNormalization", "UnitNormalization",
                    "Rescaling", "Normalization", "Reshape", "Permute", "RepeatVector", "TimeDistributed") + tuple(WINDOW_LAYERS) + MERGES + NO_OPS
#: Keras activation names -> malinn's (Keras 2 and 3 spell some differently).
SUPPORTED_ACTIVATIONS = {
    "linear": "linear", "relu": "relu", "relu6": "relu6", "sigmoid": "sigmoid", "tanh": "tanh",
    "softmax": "softmax", "softmax_v2": "softmax", "elu": "elu", "selu": "selu", "softplus": "softplus", "softsign": "softsign",
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


def to_model(km: KerasModel):
    """Builds the malinn model for ``km``.

    Args:
        km: a model read by :func:`malinn.converters.read_keras`.

    Returns:
        A built ``malinn.Sequential`` (a chain) or ``malinn.Functional`` (any other graph) with the
        Keras weights set; each layer's ``keras_names``
        lists the Keras layers it stands for.

    Raises:
        ConversionError: unsupported layers or activations (all listed at once, with the
            supported ones), a layer's dtype policy malinn does not compute (all listed at once),
            an input shape malinn cannot run, or inconsistent weights.
    """
    _check_policies(km)
    if km.graph is not None:
        return _to_functional(km)
    sample = _input_shape(km)
    shape = (None,) + sample
    unsupported = []
    built = []            # [malinn layer, keras names]
    for kl in km.layers:
        cfg = kl.config or {}
        cls = kl.class_name
        try:
            if cls in NO_OPS:
                if built:
                    built[-1][1].append(kl.name)
                continue
            layer = _layer(kl, cfg, len(shape), km.keras_major, unsupported, shape)
            if layer is None or unsupported:   # after an unsupported layer, shapes are unknown: only collect
                continue
            with weights_to_be_loaded():   # placeholders, which the file's weights replace once checked
                layer.build(shape)
            _set_file_weights(layer, _weights(kl, cfg, layer), shape)
            if kl.quantized is not None:
                layer.quantized = kl.quantized   # int8-weights uploads Keras's own int8 values
        except ValueError as exc:
            raise ConversionError(f"{km.source}: layer {kl.name!r} ({cls}): {exc}") from None
        except (KeyError, TypeError) as exc:
            raise ConversionError(f"{km.source}: layer {kl.name!r} ({cls}) has a config malinn cannot use: {exc}") from None
        affine = getattr(layer, "feature_affine", lambda: None)()
        if affine is not None and built and built[-1][0].absorb_affine(*affine):
            built[-1][1].append(kl.name)      # folded into the linear Dense before it
            continue
        built.append([layer, [kl.name]])
        shape = layer.compute_output_shape(shape)
    if not built and not unsupported and km.layers:   # inference no-ops only: the model returns its input
        built.append([lookup("layer", "Identity")(name=km.layers[0].name), [kl.name for kl in km.layers]])
    built = _fold_into_next_dense(built)
    if unsupported:
        raise _unsupported_error(km, unsupported)
    if not built:
        raise ConversionError(f"{km.source}: the model has no layer that computes anything")
    model = lookup("model", "Sequential")(name=km.name or "sequential")
    try:
        if km.input_dtypes[0] != "float32":   # Keras casts the input to its Input's dtype first
            model.add(lookup("model", "Functional").Input(sample, dtype=km.input_dtypes[0]))
        for layer, names in built:
            layer.keras_names = tuple(names)
            model.add(layer)
        model.build((None,) + sample)
    except ValueError as exc:
        raise ConversionError(f"{km.source}: {exc}") from None
    _set_source(model, km)
    return model


def _fold_into_next_dense(built: list) -> list:
    """A layer that only scales each feature of the last axis (no shift), right before a Dense, is
    folded into that Dense's kernel; its Keras names go with the Dense."""
    out = []
    for layer, names in built:
        if out and type(layer).__name__ == "Dense":
            affine = getattr(out[-1][0], "feature_affine", lambda: None)()
            if affine is not None and layer.absorb_input_affine(*affine):
                names = out.pop()[1] + names
        out.append([layer, names])
    return out


def _axes_shifted(axis):
    """A TimeDistributed inner layer's axis on the outer input: non-negative axes move by one."""
    if isinstance(axis, (list, tuple)):
        return [_axes_shifted(a) for a in axis]
    return axis + 1 if isinstance(axis, int) and not isinstance(axis, bool) and axis >= 0 else axis


def _time_distributed(kl, cfg, shape: tuple, unsupported: list):
    """The layer ``TimeDistributed(inner)`` stands for on its (batch, time, ...) input, as a Keras
    layer entry: the inner layer with its axes shifted by one (Keras applies it to each time step)."""
    inner = cfg.get("layer")
    if not isinstance(inner, dict) or not isinstance(inner.get("class_name"), str):
        unsupported.append(f"TimeDistributed {kl.name!r} without a layer in its config")
        return None
    cls, icfg = inner["class_name"], dict(inner.get("config") or {})
    if cls in ("Dense", "Activation", "ReLU", "LeakyReLU", "ELU", "ThresholdedReLU") or cls in NO_OPS:
        pass
    elif cls in ("Softmax", "BatchNormalization", "LayerNormalization", "UnitNormalization", "Normalization"):
        if icfg.get("axis") is not None:
            icfg["axis"] = _axes_shifted(icfg.get("axis", -1))
    elif cls == "PReLU":   # one alpha for every time step: shared along the time axis too
        shared = icfg.get("shared_axes") or []
        icfg["shared_axes"] = [1] + _axes_shifted(shared if isinstance(shared, list) else [shared])
    elif cls == "Permute":
        icfg["dims"] = [1] + [d + 1 for d in icfg.get("dims", [])]
    elif cls == "Reshape":
        icfg["target_shape"] = [shape[1]] + list(icfg.get("target_shape", []))
    elif cls == "Flatten":
        cls, icfg = "Reshape", {"target_shape": [shape[1], -1]}
    else:
        unsupported.append(f"TimeDistributed {kl.name!r} of {cls}")
        return None
    icfg["name"] = kl.name
    return type(kl)(class_name=cls, name=kl.name, config=icfg, weights=list(kl.weights),
                    weight_names=list(getattr(kl, "weight_names", [])))


def _layer(kl, cfg, rank: int, keras_major: int, unsupported: list, shape: tuple = ()):
    """The malinn layer for one Keras layer (None, with a line in ``unsupported``, when there is none)."""
    cls, layer_class = kl.class_name, (lambda name: lookup("layer", name))
    if cls in ("Dense", "Activation"):
        act = _map_activation(cfg.get("activation"), keras_major)
        if act is None:
            unsupported.append(f"{cls} {kl.name!r} with activation {_activation_name(cfg.get('activation'))!r}")
            return None
        if cls == "Activation":
            return layer_class("Activation")(act, name=kl.name)
        return layer_class("Dense")(int(cfg["units"]), activation=act, use_bias=bool(cfg.get("use_bias", True)),
                                    name=kl.name)
    if cls == "ReLU":
        max_value = cfg.get("max_value")
        return layer_class("ReLU")(max_value=None if max_value is None else float(max_value),
                                   negative_slope=float(cfg.get("negative_slope", 0.0) or 0.0),
                                   threshold=float(cfg.get("threshold", 0.0) or 0.0), name=kl.name)
    if cls == "LeakyReLU":
        return layer_class("LeakyReLU")(float(cfg.get("negative_slope", cfg.get("alpha", 0.3))), name=kl.name)
    if cls == "ELU":
        return layer_class("ELU")(float(cfg.get("alpha", 1.0)), name=kl.name)
    if cls == "Softmax":
        return layer_class("Softmax")(axis=cfg.get("axis", -1), name=kl.name)
    if cls == "ThresholdedReLU":
        return layer_class("ThresholdedReLU")(float(cfg.get("theta", 1.0)), name=kl.name)
    if cls == "PReLU":
        return layer_class("PReLU")(shared_axes=cfg.get("shared_axes"), name=kl.name)
    if cls == "LayerNormalization":
        return layer_class("LayerNormalization")(
            axis=cfg.get("axis", -1), epsilon=float(cfg.get("epsilon", 1e-3)), center=bool(cfg.get("center", True)),
            scale=bool(cfg.get("scale", True)), rms_scaling=bool(cfg.get("rms_scaling", False)), name=kl.name)
    if cls == "UnitNormalization":   # Keras 3: x / max(norm, 1e-12); tf_keras: x * rsqrt(max(norm^2, 1e-12))
        return layer_class("UnitNormalization")(axis=cfg.get("axis", -1),
                                                epsilon=1e-12 if keras_major >= 3 else 1e-6, name=kl.name)
    if cls == "Rescaling":
        return layer_class("Rescaling")(cfg.get("scale", 1.0), cfg.get("offset", 0.0), name=kl.name)
    if cls == "Normalization":
        given = cfg.get("mean") is not None and not kl.weights   # statistics in the config: no weights, as Keras's
        return layer_class("Normalization")(axis=cfg.get("axis", -1), invert=bool(cfg.get("invert", False)),
                                             mean=cfg["mean"] if given else None,
                                             variance=cfg["variance"] if given else None, name=kl.name)
    if cls == "Reshape":
        return layer_class("Reshape")(list(cfg.get("target_shape") or []), name=kl.name)
    if cls == "Permute":
        return layer_class("Permute")(list(cfg.get("dims") or []), name=kl.name)
    if cls == "RepeatVector":
        return layer_class("RepeatVector")(int(cfg["n"]), name=kl.name)
    if cls == "TimeDistributed":
        inner = _time_distributed(kl, cfg, shape, unsupported)
        if inner is not None and inner.class_name in NO_OPS:
            return layer_class("Identity")(name=kl.name)
        return inner and _layer(inner, inner.config, rank, keras_major, unsupported, shape)
    if cls == "Flatten":
        if rank > 2 and cfg.get("data_format", "channels_last") == "channels_first":
            unsupported.append(f"Flatten {kl.name!r} with data_format='channels_first'")
            return None
        return layer_class("Flatten")(name=kl.name)
    if cls == "BatchNormalization":
        return layer_class("BatchNormalization")(epsilon=float(cfg.get("epsilon", 1e-3)),
                                                 center=bool(cfg.get("center", True)),
                                                 scale=bool(cfg.get("scale", True)), axis=cfg.get("axis", -1),
                                                 name=kl.name)
    if cls in WINDOW_LAYERS:
        return _window_layer(kl, cfg, keras_major, unsupported)
    if cls in MERGES[:6]:
        return layer_class(cls)(name=kl.name)
    if cls == "Concatenate":
        return layer_class(cls)(axis=int(cfg.get("axis", -1)), name=kl.name)
    if cls == "Dot":
        axes = cfg.get("axes")
        axes = [int(a) for a in axes] if isinstance(axes, (list, tuple)) else int(axes)
        # the least norm normalize divides by: Keras 3's epsilon; tf_keras's l2_normalize floors the squares at 1e-12
        return layer_class(cls)(axes, normalize=bool(cfg.get("normalize", False)),
                                epsilon=1e-7 if keras_major >= 3 else 1e-6, name=kl.name)
    if cls == "RandomCrop":   # not one of the AUGMENTATIONS dropped: what it does at inference depends on the Keras
        unsupported.append(f"RandomCrop {kl.name!r} (tf_keras crops and resizes at inference, Keras 3 returns the "
                           "input: crop the images before predict and save the model without it)")
        return None
    unsupported.append(f"{cls} {kl.name!r}")
    return None


def _check_policies(km: KerasModel) -> None:
    """Refuses every layer whose dtype policy malinn does not compute (an integer, string or
    complex policy, a name Keras does not know), naming each and the supported ones."""
    problems = [f"layer {kl.name!r} ({kl.class_name}) has the {problem}" for kl in km.layers
                if (problem := policy_problem(kl.config or {})) is not None]
    if problems:
        raise ConversionError(f"{km.source}: {'; '.join(problems)}; malinn computes in float32 the layers of Keras's "
                              f"float policies ({', '.join(FLOAT_POLICIES)}) and int8-quantized Dense layers")


def _unsupported_error(km: KerasModel, unsupported: list) -> ConversionError:
    return ConversionError(
        f"{km.source}: {len(unsupported)} unsupported layer(s): {'; '.join(unsupported)}. "
        f"Supported layers: {', '.join(SUPPORTED_LAYERS)}. "
        f"Supported activations: {', '.join(sorted(SUPPORTED_ACTIVATIONS))}.")


def _to_functional(km: KerasModel):
    """The ``Functional`` model of a Keras graph: each Keras layer becomes one malinn layer (called
    as often as Keras calls it), inference no-ops pass their input on."""
    graph, by_name = km.graph, {kl.name: kl for kl in km.layers}
    functional = lookup("model", "Functional")
    tensors, ranks, made, made_calls, unsupported = {}, {}, {}, {}, []
    dtypes = tuple(km.input_dtypes) + ("float32",) * (len(graph.inputs) - len(km.input_dtypes))
    for (tensor, name, shape), dtype in zip(graph.inputs, dtypes):
        if shape is None or any(d is None for d in shape):
            raise ConversionError(f"{km.source}: input {name!r} has the shape {_with_batch(shape)}, which is not "
                                  "fully known; malinn needs every axis but the batch to be fixed")
        tensors[tensor] = functional.Input(tuple(int(d) for d in shape), name=name, dtype=dtype)
        ranks[tensor] = 1 + len(shape)
    for call in graph.calls:
        kl = by_name[call.layer]
        ranks[call.output] = ranks.get(call.inputs[0], 2)
        if call.constant is not None:
            unsupported.append(f"{kl.class_name} {kl.name!r} with a constant operand ({call.constant}: malinn runs "
                               "Keras operators on two tensors only; a layer may do it: x * c + d is Rescaling(c, d), "
                               "maximum(x, 0) is ReLU)")
            continue
        if call.training and kl.class_name in TRAINING_DEPENDENT:
            unsupported.append(f"{kl.class_name} {kl.name!r} called with training=True (tf_keras's predict runs its "
                               "training behaviour there: Dropout's and the augmentation layers' randomness, "
                               "BatchNormalization on the batch's statistics; malinn runs inference: build the "
                               "model without training=True and save it again)")
            continue
        if kl.class_name in NO_OPS:
            if call.inputs[0] in tensors:
                tensors[call.output] = tensors[call.inputs[0]]
            continue
        try:
            if kl.name not in made:
                first = tensors.get(call.inputs[0])
                shape = first.shape if first is not None else (None,) * ranks[call.output]
                made[kl.name] = _layer(kl, kl.config or {}, ranks[call.output], km.keras_major, unsupported, shape)
            layer = made[kl.name]
            if layer is None or not all(t in tensors for t in call.inputs):
                continue   # after an unsupported layer, what reads it is only checked for its class
            given = [tensors[t] for t in call.inputs]
            try:
                with weights_to_be_loaded():   # placeholders, which the file's weights replace once checked
                    out = layer(given if call.listed else given[0])
            except ValueError as exc:   # a supported class on shapes malinn does not run (a Dot of rank 4)
                why = str(exc).removeprefix(f"{kl.class_name} {kl.name!r}: ")
                unsupported.append(f"{kl.class_name} {kl.name!r} ({why})")
                continue
            tensors[call.output], ranks[call.output] = out, len(out.shape)
            if len(made_calls.setdefault(kl.name, [])) == 0:   # once, after the first call built it
                made_calls[kl.name].append(out)
                _set_file_weights(layer, _weights(kl, kl.config or {}, layer), given[0].shape)
                if kl.quantized is not None:
                    layer.quantized = kl.quantized   # int8-weights uploads Keras's own int8 values
        except ValueError as exc:
            raise ConversionError(f"{km.source}: layer {kl.name!r} ({kl.class_name}): {exc}") from None
        except (KeyError, TypeError) as exc:
            raise ConversionError(f"{km.source}: layer {kl.name!r} ({kl.class_name}) has a config malinn cannot "
                                  f"use: {exc}") from None
    if unsupported:
        raise _unsupported_error(km, unsupported)
    for name, layer in made.items():
        layer.keras_names = (name,)
    inputs = [tensors[t] for t, _, _ in graph.inputs]
    outputs = [tensors[t] for t in graph.outputs]
    if not made:   # inputs (or inference no-ops on them) only: an Identity layer computes each output
        identities = {}
        for i, t in enumerate(outputs):
            if id(t) not in identities:
                identities[id(t)] = lookup("layer", "Identity")(name=f"{t.name}_identity")(t)
            outputs[i] = identities[id(t)]
    try:
        if graph.output_names:
            outputs = dict(zip(graph.output_names, outputs))
        model = functional(inputs if len(inputs) > 1 else inputs[0],
                           outputs if isinstance(outputs, dict) or len(outputs) > 1 else outputs[0],
                           name=km.name or "functional")
    except ValueError as exc:
        raise ConversionError(f"{km.source}: {exc}") from None
    _set_source(model, km)
    return model


def _set_source(model, km: KerasModel) -> None:
    """``model.source``: the Keras file (the architecture of a split form, its weights file beside)."""
    model.source = {"file": str(km.files[0] if km.files else km.source), "format": km.format,
                    "keras_version": km.keras_version}
    if len(km.files) > 1:
        model.source["weights"] = str(km.files[1])


def _set_file_weights(layer, weights: list, shape: tuple) -> None:
    """Gives ``layer``, built on inputs of ``shape`` with placeholder weights (which take no memory),
    the file's ``weights``, once it is clear that its config asks for no more than the file holds:
    every size a config declares (a kernel's, from its input shape, units, filters, kernel size) is
    checked against the weight the file stores before anything of that size is made. A layer that has
    weights but none in the file is refused (its placeholders were zeros, before them random values).

    Raises:
        ValueError: the file holds no weights for the layer, a smaller one than the layer's config
            makes, or none for one of its weights (set_weights' own errors for another count or shape).
    """
    declared = layer.weight_arrays()
    made = ", ".join(str(tuple(w.shape)) for w in declared)
    if declared and not weights:
        raise ValueError(f"the file holds no weights for it; on inputs of shape {format_shape(shape)} its config "
                         f"makes weights of shapes {made}")
    if any(mine.size > theirs.size for mine, theirs in zip(declared, weights)):
        raise ValueError(f"on inputs of shape {format_shape(shape)} its config makes weights of shapes {made}, larger "
                         f"than the file's {', '.join(str(tuple(w.shape)) for w in weights)}")
    if weights:
        layer.set_weights(weights)
    missing = placeholders(layer)
    if missing:
        raise ValueError(f"the file holds no value for its {', '.join(missing)}")


def _weights(kl, cfg, layer) -> list:
    """The weights to set on ``layer``: the file's; a TimeDistributed PReLU's alpha with the time axis
    put back."""
    weights = [np.asarray(w, np.float32) for w in kl.weights]
    kind = type(layer).__name__
    if kind == "PReLU" and weights and (1,) + weights[0].shape == layer.alpha_shape:   # TimeDistributed's inner alpha
        weights = [weights[0].reshape(layer.alpha_shape)]
    return weights


def _window_layer(kl, cfg, keras_major: int, unsupported: list):
    """A convolution, pooling or pixel-moving layer with the config keys Keras saved (those malinn
    takes; a Keras 2 ``groups`` of 1 or a missing ``keepdims`` fall back to the defaults)."""
    kwargs = {key: cfg[key] for key in WINDOW_LAYERS[kl.class_name] if key in cfg}
    if "activation" in kwargs:
        act = _map_activation(kwargs["activation"], keras_major)
        if act is None:
            unsupported.append(f"{kl.class_name} {kl.name!r} with activation "
                               f"{_activation_name(kwargs['activation'])!r}")
            return None
        kwargs["activation"] = act
    for key in ("kernel_size", "strides", "dilation_rate", "pool_size", "size"):
        if isinstance(kwargs.get(key), list):
            kwargs[key] = tuple(kwargs[key])
    return lookup("layer", kl.class_name)(name=kl.name, **kwargs)


def _with_batch(shape) -> str:
    """One sample's ``shape`` as Keras shows the input's: ``(None, None, 4)`` (the batch axis first, so
    that an unknown axis of the sample does not look like the batch's)."""
    return "unknown" if shape is None else str((None,) + tuple(shape))


def _input_shape(km: KerasModel) -> tuple:
    shape = km.input_shape
    if shape is None or any(d is None for d in shape):
        first_dense = next((l for l in km.layers if l.class_name == "Dense" and l.weights), None)
        if shape is not None and len(shape) > 1 or first_dense is None:
            raise ConversionError(f"{km.source}: the model's input shape {_with_batch(shape)} is not fully known; "
                                  "malinn needs every axis but the batch to be fixed")
        return (int(first_dense.weights[0].shape[0]),)
    return tuple(int(d) for d in shape)
