"""Turns a :class:`KerasModel` (what a Keras file holds) into a malinn ``Sequential`` (a chain) or
``Functional`` (any other graph: merges, shared layers, several inputs and outputs).

One path for both: a chain is a graph whose calls each read the one before
(:meth:`KerasGraph.of_chain`). Each call's Keras class names the malinn layer class that converts
it (registered under the Keras class names it declares: :mod:`malinn.layers.keras_config`), whose
``from_keras_config`` makes the layer; the layer is called on the malinn tensors of the call's
inputs (built with placeholders) and given the file's weights. Layers that compute nothing at
inference (those :class:`~malinn.layers.Identity` stands for: Dropout and friends, the random
augmentations) pass their input on; ``TimeDistributed(layer)`` becomes the layer's
``from_keras_time_distributed`` (the layer itself on the wider input, its axes shifted by one).

A chain then becomes a ``Sequential``, where a per-feature affine layer on the last axis
(BatchNormalization, Rescaling, Normalization) right after a linear Dense is folded into that
Dense's kernel and bias (the layer's ``absorb_affine``), one that only scales (no shift) right
before a Dense into that Dense's kernel (``absorb_input_affine``), and the names of the no-ops go
with the layer before them; any other graph becomes a ``Functional``. Every unsupported layer or
activation is collected and reported in one ``ConversionError``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from malinn.errors import ConversionError
from malinn.layers.base import Layer, placeholders, weights_to_be_loaded
from malinn.layers.keras_config import SUPPORTED_ACTIVATIONS, KerasContext, NotConvertible
from malinn.layers.operators import operator_layer
from malinn.plan.tensor import format_shape
from malinn.registry import lookup, names

from .dtypes import FLOAT_POLICIES, policy_problem
from .model_spec import KerasCall, KerasGraph, KerasLayer, KerasModel

__all__ = ["to_model", "supported_layers", "SUPPORTED_ACTIVATIONS", "WRAPPERS"]

#: Keras layers that hold another and are converted here, not by a malinn layer class
WRAPPERS = ("TimeDistributed",)


def supported_layers() -> list:
    """The Keras layer classes the converter takes, sorted: those a malinn layer class declares it
    converts (its own name and aliases, not those it refuses) and the wrappers."""
    declared = [name for name in names("keras") if name not in lookup("keras", name).keras_refused]
    return sorted(declared + list(WRAPPERS))


def to_model(km: KerasModel) -> Any:
    """Builds the malinn model for ``km``.

    Args:
        km: a model read by :func:`malinn.converters.read_keras`.

    Returns:
        A built ``malinn.Sequential`` (a chain) or ``malinn.Functional`` (any other graph) with the
        Keras weights set; each layer's ``keras_names`` lists the Keras layers it stands for.

    Raises:
        ConversionError: unsupported layers or activations (all listed at once, with the
            supported ones), a layer's dtype policy malinn does not compute (all listed at once),
            an input shape malinn cannot run, or inconsistent weights.
    """
    _check_policies(km)
    if km.graph is None:
        sample = _chain_input_shape(km)
        conversion = _Conversion(km, KerasGraph.of_chain(km.layers, sample))
        model = _sequential(km, sample, conversion)
    else:
        model = _functional(km, _Conversion(km, km.graph))
    _set_source(model, km)
    return model


class _Conversion:
    """The malinn layers and tensors of a Keras graph's calls (converted on construction).

    Attributes:
        tensors: the graph's tensor names -> malinn tensors (a no-op's output is its input's).
        made: the Keras layer names -> their malinn layers, in the order of their first calls (a
            shared layer once; inference no-ops have none).

    Raises:
        ConversionError: as :func:`to_model`.
    """

    def __init__(self, km: KerasModel, graph: KerasGraph):
        self.km, self.graph = km, graph
        self.tensors: dict = {}
        self.made: dict = {}
        self.unsupported: list = []
        self._ranks: dict = {}
        self._weighted: set = set()  # the layers given the file's weights
        self._inputs()
        by_name = {kl.name: kl for kl in km.layers}
        readers: dict = {}
        for c in graph.calls:
            for t, argument in zip(c.inputs, c.arguments or ("",) * len(c.inputs)):
                # a wrapper's mask argument is dropped (its layer hands the input's mask on)
                wrapped = by_name[c.layer].class_name in WRAPPERS and _is_mask_argument(argument)
                wrapped = wrapped or _same_mask_twice(c, by_name[c.layer])
                readers.setdefault(t, []).append(_MaskReader if wrapped else _keras_class(by_name[c.layer].class_name))
        for call in graph.calls:
            if (
                _same_mask_twice(call, by_name[call.layer])
                and call.inputs[0] in self.tensors
                and all(getattr(cls, "keras_takes_mask", False) for cls in readers.get(call.output) or [None])
            ):
                # Keras 3's mask of a merge of inputs of one mask: that mask OR (AND) itself
                self.tensors[call.output] = self.tensors[call.inputs[0]]
                continue
            if _mask_of_indices(call, by_name[call.layer], readers.get(call.output)):
                # Keras 3's mask of an Embedding, not_equal(x, 0), handed to the layers that take a mask:
                # x itself is that mask to them (a step is kept where its value is not 0)
                if call.inputs[0] in self.tensors:
                    self.tensors[call.output] = self.tensors[call.inputs[0]]
                continue
            self._call(call, by_name[call.layer])
        if self.unsupported:
            raise ConversionError(
                f"{km.source}: {len(self.unsupported)} unsupported layer(s): {'; '.join(self.unsupported)}. "
                f"Supported layers: {', '.join(supported_layers())}. "
                f"Supported activations: {', '.join(sorted(SUPPORTED_ACTIVATIONS))}."
            )
        for name, layer in self.made.items():
            layer.keras_names = (name,)

    def _inputs(self) -> None:
        dtypes = tuple(self.km.input_dtypes) + ("float32",) * (len(self.graph.inputs) - len(self.km.input_dtypes))
        for (tensor, name, shape), dtype in zip(self.graph.inputs, dtypes):
            if shape is None or any(d is None for d in shape):
                raise ConversionError(
                    f"{self.km.source}: input {name!r} has the shape {_with_batch(shape)}, which is "
                    "not fully known; malinn needs every axis but the batch to be fixed"
                )
            try:
                self.tensors[tensor] = lookup("model", "Functional").Input(
                    tuple(int(d) for d in shape), name=name, dtype=dtype
                )
            except ValueError as exc:  # no axis besides the batch's, a size below 1
                raise ConversionError(f"{self.km.source}: {exc}") from None
            self._ranks[tensor] = 1 + len(shape)

    def _call(self, call: KerasCall, kl: KerasLayer) -> None:
        """Converts one call: the layer (on its first call), its output tensor, the file's weights."""
        self._ranks[call.output] = self._ranks.get(call.inputs[0], 2)
        cls = _keras_class(kl.class_name)
        if call.operand is not None:  # x + 3, a TFOpLambda given a constant or options
            self._operator(call, kl)
            return
        if call.constant is not None:
            self.unsupported.append(
                f"{kl.class_name} {kl.name!r} with a constant operand ({call.constant}: malinn "
                "runs Keras operators on two tensors only; a layer may do it: x * c + d is "
                "Rescaling(c, d), maximum(x, 0) is ReLU)"
            )
            return
        if call.training and cls is not None and kl.class_name in cls.keras_training_dependent:
            self.unsupported.append(
                f"{kl.class_name} {kl.name!r} called with training=True (tf_keras's predict runs "
                "its training behaviour there: Dropout's and the augmentation layers' randomness, "
                "BatchNormalization on the batch's statistics; malinn runs inference: build the "
                "model without training=True and save it again)"
            )
            return
        if cls is not None and cls.keras_no_op and kl.class_name not in cls.keras_refused:
            if call.inputs[0] in self.tensors:  # passes its input on
                self.tensors[call.output] = self.tensors[call.inputs[0]]
            return
        try:
            first = self.tensors.get(call.inputs[0])
            shape = first.shape if first is not None else (None,) * self._ranks[call.output]
            if kl.name not in self.made:
                try:
                    self.made[kl.name] = self._layer(kl, shape)
                except ValueError:
                    if first is not None:
                        raise
                    self.made[kl.name] = None  # its input unknown, after a layer that was not converted
            layer = self.made[kl.name]
            if layer is None or not all(t in self.tensors for t in call.inputs):
                return  # after an unsupported layer, what reads it is only checked for its class
            given = [self.tensors[t] for t in call.inputs]
            listed = call.listed
            if kl.class_name in WRAPPERS and call.arguments:  # TimeDistributed(layer)(x, mask=m): m passes on
                given = [g for g, a in zip(given, call.arguments) if not _is_mask_argument(a)]
                listed = listed and len(given) > 1
            try:
                with weights_to_be_loaded():  # placeholders, which the file's weights replace once checked
                    keras_call = getattr(layer, "keras_call", None)
                    if keras_call is not None:  # a layer of several named inputs (MultiHeadAttention)
                        out = keras_call(
                            dict(zip(call.arguments or [str(i) for i in range(len(given))], given)), dict(call.options)
                        )
                    else:
                        out = layer(given if listed else given[0])
            except ValueError as exc:
                if not call.listed:
                    raise
                # a merge of a supported class on shapes malinn does not run (a Dot of rank 4)
                why = str(exc).removeprefix(f"{kl.class_name} {kl.name!r}: ")
                self.unsupported.append(f"{kl.class_name} {kl.name!r} ({why})")
                return
            outs = out if isinstance(out, list) else [out]  # a recurrent layer's output and states
            for i, one in enumerate(outs):
                name = call.output if i == 0 else f"{call.output}@{i}"
                self.tensors[name], self._ranks[name] = one, len(one.shape)
            if kl.name not in self._weighted:  # once, after the first call built it
                self._weighted.add(kl.name)
                _set_file_weights(
                    layer, layer.from_keras_weights([np.asarray(w, np.float32) for w in kl.weights]), given[0].shape
                )
                if kl.quantized is not None:
                    layer.quantized = kl.quantized  # int8-weights uploads Keras's own int8 values
        except ValueError as exc:
            raise ConversionError(f"{self.km.source}: layer {kl.name!r} ({kl.class_name}): {exc}") from None
        except (KeyError, TypeError) as exc:
            raise ConversionError(
                f"{self.km.source}: layer {kl.name!r} ({kl.class_name}) has a config malinn cannot use: {exc}"
            ) from None

    def _operator(self, call: KerasCall, kl: KerasLayer) -> None:
        """Converts one call of an operator given a constant or options (``call.operand``): the layer
        :func:`~malinn.layers.operators.operator_layer` makes of it, called on the call's tensors."""
        if not all(t in self.tensors for t in call.inputs):
            return  # after an unsupported layer
        given = [self.tensors[t] for t in call.inputs]
        keras = KerasContext(
            class_name=kl.class_name,
            name=kl.name,
            keras_major=self.km.keras_major,
            input_shape=tuple(given[0].shape),
            has_weights=False,
        )
        try:
            layer = self.made.get(kl.name) or operator_layer(kl.config or {}, call.operand or {}, keras)
            self.made[kl.name] = layer
            out = layer(given if len(given) > 1 else given[0])
        except NotConvertible as exc:
            self.unsupported.append(_refusal(keras, exc))
            return
        except ValueError as exc:
            raise ConversionError(f"{self.km.source}: layer {kl.name!r} ({kl.class_name}): {exc}") from None
        self.tensors[call.output], self._ranks[call.output] = out, len(out.shape)

    def _layer(self, kl: KerasLayer, shape: tuple) -> Layer | None:
        """The malinn layer for one Keras layer called on ``shape`` (None, with a line in
        ``unsupported``, where there is none)."""
        keras = KerasContext(
            class_name=kl.class_name,
            name=kl.name,
            keras_major=self.km.keras_major,
            input_shape=tuple(shape),
            has_weights=bool(kl.weights),
        )
        try:
            if kl.class_name in WRAPPERS:
                layer = _time_distributed(kl.config or {}, keras)
                layer.keras_passes_mask = True  # Keras's TimeDistributed hands its input's mask on
                return layer
            return _convert(kl.config or {}, keras)
        except NotConvertible as exc:
            self.unsupported.append(_refusal(keras, exc))
        except _Refused as exc:
            self.unsupported.append(str(exc))
        return None


def _mask_of_indices(call: KerasCall, kl: KerasLayer, readers: list | None) -> bool:
    """Whether ``call`` is Keras 3's ``not_equal(x, 0)`` that only layers taking a mask read (as
    their mask: ``keras_takes_mask``)."""
    return (
        kl.class_name == "NotEqual"
        and call.constant in ("0", "0.0")
        and readers is not None
        and bool(readers)
        and all(getattr(cls, "keras_takes_mask", False) for cls in readers)
    )


def _same_mask_twice(call: KerasCall, kl: KerasLayer) -> bool:
    """Whether ``call`` is Keras 3's ``logical_or`` (``logical_and``) of a mask and itself, the mask
    a merge's output gets from inputs of one mask."""
    return (
        kl.class_name in ("LogicalOr", "LogicalAnd")
        and len(call.inputs) == 2
        and call.inputs[0] == call.inputs[1]
        and call.constant is None
        and call.operand is None
    )


def _is_mask_argument(argument: str) -> bool:
    """Whether a call's argument is Keras's ``mask`` (``"mask"``, ``"mask.1"``)."""
    return argument == "mask" or argument.startswith("mask.")


class _MaskReader:
    """Stands for a reader that takes a mask argument and drops it (a wrapper's)."""

    keras_takes_mask = True


class _Refused(Exception):
    """A line of the unsupported list, whole (a wrapper's inner layer named by its own class)."""


def _refusal(keras: KerasContext, exc: NotConvertible) -> str:
    why = str(exc)
    return f"{keras.class_name} {keras.name!r}" + (f" {why}" if why else "")


def _keras_class(class_name: str) -> type[Layer] | None:
    """The malinn layer class that converts Keras's ``class_name``, or None."""
    try:
        return lookup("keras", class_name)
    except KeyError:
        return None


def _convert(config: dict, keras: KerasContext) -> Layer:
    """The layer ``keras.class_name``'s malinn class makes of ``config``.

    Raises:
        NotConvertible: no class converts it, or its class refuses it.
    """
    cls = _keras_class(keras.class_name)
    if cls is None:
        raise NotConvertible("")
    if keras.class_name in cls.keras_refused:
        raise NotConvertible(cls.keras_refused[keras.class_name])
    return cls.from_keras_config(config, keras)


def _time_distributed(config: dict, keras: KerasContext) -> Layer:
    """The layer ``TimeDistributed(inner)`` stands for on its ``(batch, time, ...)`` input: the inner
    layer's class says it (``from_keras_time_distributed``).

    Raises:
        NotConvertible: the config holds no layer, or its class has no such layer.
        _Refused: the inner layer's config is one malinn does not compute (named by its class).
    """
    inner = config.get("layer")
    if not isinstance(inner, dict) or not isinstance(inner.get("class_name"), str):
        raise NotConvertible("without a layer in its config")
    cls_name, inner_keras = inner["class_name"], keras.of(inner["class_name"])
    cls = _keras_class(cls_name)
    layer = None
    if cls is not None and cls_name not in cls.keras_refused:
        try:
            layer = cls.from_keras_time_distributed(dict(inner.get("config") or {}), inner_keras)
        except NotConvertible as exc:
            raise _Refused(_refusal(inner_keras, exc)) from None
    if layer is None:
        raise NotConvertible(f"of {cls_name}")
    return layer


def _sequential(km: KerasModel, sample: tuple, conversion: _Conversion) -> Any:
    """The ``Sequential`` of a chain's converted layers, affine layers folded into a neighbouring
    Dense and each inference no-op's name given to the layer before it."""
    built: list = []  # [malinn layer, keras names]
    for call in conversion.graph.calls:
        layer = conversion.made.get(call.layer)
        if layer is None:  # an inference no-op
            if built:
                built[-1][1].append(call.layer)
            continue
        affine = getattr(layer, "feature_affine", lambda: None)()
        if affine is not None and built and built[-1][0].absorb_affine(*affine):
            built[-1][1].append(call.layer)  # folded into the linear Dense before it
            continue
        built.append([layer, [call.layer]])
    if not built and km.layers:  # inference no-ops only: the model returns its input
        built.append([lookup("layer", "Identity")(name=km.layers[0].name), [kl.name for kl in km.layers]])
    built = _fold_into_next_dense(built)
    if not built:
        raise ConversionError(f"{km.source}: the model has no layer that computes anything")
    model = lookup("model", "Sequential")(name=km.name or "sequential")
    try:
        if km.input_dtypes[0] != "float32":  # Keras casts the input to its Input's dtype first
            model.add(lookup("model", "Functional").Input(sample, dtype=km.input_dtypes[0]))
        for layer, keras_names in built:
            layer.keras_names = tuple(keras_names)
            model.add(layer)
        model.build((None,) + sample)
    except ValueError as exc:
        raise ConversionError(f"{km.source}: {exc}") from None
    return model


def _fold_into_next_dense(built: list) -> list:
    """A layer that only scales each feature of the last axis (no shift), right before a Dense, is
    folded into that Dense's kernel; its Keras names go with the Dense."""
    out: list = []
    for layer, keras_names in built:
        if out and type(layer).__name__ == "Dense":
            affine = getattr(out[-1][0], "feature_affine", lambda: None)()
            if affine is not None and layer.absorb_input_affine(*affine):
                keras_names = out.pop()[1] + keras_names
        out.append([layer, keras_names])
    return out


def _functional(km: KerasModel, conversion: _Conversion) -> Any:
    """The ``Functional`` of a graph's converted layers (an Identity layer computes each output of
    a graph of inputs and inference no-ops only)."""
    graph, tensors = conversion.graph, conversion.tensors
    inputs = [tensors[t] for t, _, _ in graph.inputs]
    outputs = [tensors[t] for t in graph.outputs]
    if not conversion.made:
        identities = {}
        for i, t in enumerate(outputs):
            if id(t) not in identities:
                identities[id(t)] = lookup("layer", "Identity")(name=f"{t.name}_identity")(t)
            outputs[i] = identities[id(t)]
    try:
        named = dict(zip(graph.output_names, outputs)) if graph.output_names else None
        return lookup("model", "Functional")(
            inputs if len(inputs) > 1 else inputs[0],
            named if named is not None else outputs if len(outputs) > 1 else outputs[0],
            name=km.name or "functional",
        )
    except ValueError as exc:
        raise ConversionError(f"{km.source}: {exc}") from None


def _check_policies(km: KerasModel) -> None:
    """Refuses every layer whose dtype policy malinn does not compute (an integer, string or
    complex policy, a name Keras does not know), naming each and the supported ones; an operation
    whose ``dtype`` is its output's (``zeros_like(x, dtype="bool")``: its class's
    ``keras_output_dtypes``) is not refused for it."""
    problems = [
        f"layer {kl.name!r} ({kl.class_name}) has the {problem}"
        for kl in km.layers
        if (problem := policy_problem(kl.config or {})) is not None
        and (kl.config or {}).get("dtype") not in getattr(_keras_class(kl.class_name), "keras_output_dtypes", ())
    ]
    if problems:
        raise ConversionError(
            f"{km.source}: {'; '.join(problems)}; malinn computes in float32 the layers of Keras's "
            f"float policies ({', '.join(FLOAT_POLICIES)}) and int8-quantized Dense layers"
        )


def _set_source(model: Any, km: KerasModel) -> None:
    """``model.source``: the Keras file (the architecture of a split form, its weights file beside)."""
    model.source = {
        "file": str(km.files[0] if km.files else km.source),
        "format": km.format,
        "keras_version": km.keras_version,
    }
    if len(km.files) > 1:
        model.source["weights"] = str(km.files[1])


def _set_file_weights(layer: Layer, weights: list, shape: tuple) -> None:
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
        raise ValueError(
            f"the file holds no weights for it; on inputs of shape {format_shape(shape)} its config "
            f"makes weights of shapes {made}"
        )
    if any(mine.size > theirs.size for mine, theirs in zip(declared, weights)):
        raise ValueError(
            f"on inputs of shape {format_shape(shape)} its config makes weights of shapes {made}, larger "
            f"than the file's {', '.join(str(tuple(w.shape)) for w in weights)}"
        )
    if weights:
        layer.set_weights(weights)
    missing = placeholders(layer)
    if missing:
        raise ValueError(f"the file holds no value for its {', '.join(missing)}")


def _with_batch(shape: tuple | None) -> str:
    """One sample's ``shape`` as Keras shows the input's: ``(None, None, 4)`` (the batch axis first, so
    that an unknown axis of the sample does not look like the batch's)."""
    return "unknown" if shape is None else str((None,) + tuple(shape))


def _chain_input_shape(km: KerasModel) -> tuple:
    """A chain's sample shape: the file's, or (a Keras 2 Sequential that records none) the input
    width of its first Dense's kernel."""
    shape = km.input_shape
    if shape is None or any(d is None for d in shape):
        first_dense = next((l for l in km.layers if l.class_name == "Dense" and l.weights), None)
        if shape is not None and len(shape) > 1 or first_dense is None:
            raise ConversionError(
                f"{km.source}: the model's input shape {_with_batch(shape)} is not fully known; "
                "malinn needs every axis but the batch to be fixed"
            )
        return (int(first_dense.weights[0].shape[0]),)
    return tuple(int(d) for d in shape if d is not None)  # every axis is known (checked above)
