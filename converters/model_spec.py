"""What a Keras file holds, as plain Python data: :class:`KerasModel` and :class:`KerasLayer`.

The readers fill these from the file and nothing else: configs are kept exactly as the file
writes them (Keras 2 and Keras 3 spell some fields differently, e.g. ``LeakyReLU`` has ``alpha``
in Keras 2 and ``negative_slope`` in Keras 3), and no layer is judged supported or not here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: The values :attr:`KerasModel.format` takes (``*-json``: an architecture JSON with a weights
#: file, named by the JSON's generation).
FORMATS = ("keras3-zip", "keras3-h5", "keras2-h5", "keras3-json", "keras2-json")


def version_major(version: str | None) -> int | None:
    """The leading number of a version string (``"2.15.0-tf"`` -> 2), or None."""
    digits = ""
    for ch in (version or "").strip():
        if not ch.isdigit():
            break
        digits += ch
    return int(digits) if digits else None


@dataclass
class KerasLayer:
    """One layer of the chain.

    ``name`` is the layer's own, or its path through the nested models that hold it
    (``encoder/dense``) where another layer of the model has the same name
    (:func:`converters.chain.leaf_names`).

    ``weights`` are float32 arrays in Keras's order (``layer.get_weights()``; bfloat16 ones
    widened, a LoRA Dense's factors merged into its kernel): Dense gives
    kernel ``(in, units)`` then bias ``(units,)``; BatchNormalization gives gamma, beta,
    moving_mean, moving_variance, without gamma when ``scale`` is false and without beta when
    ``center`` is false. ``weight_names`` are the names the file gives them (``"dense/kernel:0"``
    in ``.h5`` files, ``"vars/0"`` in ``.keras`` files), for messages.
    """

    class_name: str
    name: str
    config: dict[str, Any]
    weights: list[np.ndarray] = field(default_factory=list)
    weight_names: list[str] = field(default_factory=list)
    #: an int8-quantized Dense's own int8 form, ``(q (units x in) int8, scales (units,))`` with
    #: ``kernel^T ~ q * scales[:, None]`` (dense_variants.py), else None
    quantized: tuple | None = None


@dataclass
class KerasCall:
    """One call of a leaf layer in a Functional graph: the tensors it reads (``listed``: as a list,
    a merge layer's) and the tensor it makes. Tensors are named by strings unique in the graph;
    ``layer`` is the :class:`KerasLayer`'s name (its path through nested models where a bare name
    repeats: ``encoder/dense``). ``constant``: the constant operand of a Keras 3 operator
    (``x * 2.0`` reads one tensor and ``2.0``), as shown in messages, else None. ``training``: the
    call (or a nested model's call around it) passed ``training=True`` in a tf_keras file, whose
    predict then runs the layer's training behaviour."""

    layer: str
    inputs: list[str]
    output: str
    listed: bool = False
    constant: str | None = None
    training: bool = False
    #: the argument each input was passed as (``"0"``, ``"key"``, ``"mask.1"``: converters.chain.node_arguments),
    #: where the call passed tensors by keyword or options; empty otherwise
    arguments: tuple = ()
    #: the call's other keyword arguments (``use_causal_mask``), where ``arguments`` is given
    options: dict = field(default_factory=dict)
    #: an operator's arguments besides its tensors (converters.chain.operator_arguments): Keras 3's
    #: ``x + 3`` and tf_keras's TFOpLambda calls given a constant or options; None for any other call
    operand: dict | None = None


@dataclass
class KerasGraph:
    """A Functional model with nested models expanded: ``inputs`` as ``(tensor, name, sample
    shape)``, the ``calls`` in an order where each comes after the calls it reads, ``outputs`` (and
    their names where the model's outputs are a dict)."""

    inputs: list[tuple]
    calls: list[KerasCall]
    outputs: list[str]
    output_names: list[str] | None = None  # Keras 3 models whose outputs are a dict

    @classmethod
    def of_chain(cls, layers: list, sample_shape: tuple) -> "KerasGraph":
        """A chain of ``layers`` (:class:`KerasLayer`) as a graph: one input of ``sample_shape``, each
        layer called once on the output of the one before."""
        current, calls = "input#0", []
        for index, layer in enumerate(layers):
            calls.append(KerasCall(layer=layer.name, inputs=[current], output=f"{layer.name}#{index + 1}"))
            current = calls[-1].output
        return cls(inputs=[("input#0", "input", tuple(sample_shape))], calls=calls, outputs=[current])

    def is_chain(self) -> bool:
        """One input, one output, and each call reads the one before it (a Sequential would do)."""
        if len(self.inputs) != 1 or len(self.outputs) != 1:
            return False
        current = self.inputs[0][0]
        names = set()
        for call in self.calls:
            if call.listed or call.inputs != [current] or call.layer in names:
                return False
            names.add(call.layer)
            current = call.output
        return current == self.outputs[0]


@dataclass
class KerasModel:
    """A Keras model read from a file: its layers, in execution order for a chain.

    ``format`` is one of :data:`FORMATS`. A ``.keras`` archive written by tf_keras (Keras 2)
    is ``"keras3-zip"`` (that is the name of the archive format) with ``keras_version``
    ``"2.x"``; use :attr:`keras_major` to choose between Keras 2 and Keras 3 semantics (they
    differ, e.g. ``hard_sigmoid``). ``input_shape`` has no batch dimension and is ``None``
    when the file does not record it. InputLayers are not in ``layers``; nested Sequential or
    single-chain Functional models are flattened into the chain. ``source`` names what was read,
    for messages (``"model.json + weights.h5"`` for a split form); ``files`` the paths read
    (empty: ``source`` is the one file).
    """

    source: str
    format: str
    keras_version: str | None
    input_shape: tuple[int | None, ...] | None
    layers: list[KerasLayer]
    name: str | None = None
    model_class: str | None = None
    #: the graph of a Functional model that is not a single chain (then ``layers`` holds every
    #: leaf layer once, in the order of their first call); ``None`` for a chain
    graph: KerasGraph | None = None
    files: tuple[str, ...] = ()
    #: the dtype of each input (``"float32"``, ``"int32"``...: its InputLayer's, which Keras casts
    #: the input to at the model's entry), in the order of ``graph.inputs`` (a chain: its one input)
    input_dtypes: tuple[str, ...] = ("float32",)

    @property
    def keras_major(self) -> int:
        """2 or 3: the Keras generation whose definitions the file's configs follow."""
        major = version_major(self.keras_version)
        if major is not None:
            return major
        return 2 if self.format in ("keras2-h5", "keras2-json") else 3
