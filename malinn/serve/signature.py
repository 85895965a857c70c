"""A served model's signature: its named inputs and outputs, their sample shapes and dtypes.

TensorFlow Serving describes a Keras model by its ``serving_default`` signature: an input per
``keras.Input`` (named as the Input, ``<first layer>_input`` for a Sequential, as Keras 2's export
names it), an output per model output (named as the layer that makes it, or as the output dict's
key). malinn's model gives the same, and the metadata API answers it in TensorFlow Serving's form.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TensorSpec", "Signature", "SIGNATURE_NAME", "TF_DTYPES"]

#: the one signature a Keras model is served under
SIGNATURE_NAME = "serving_default"

#: Keras's dtype names as TensorFlow's DataType enum names them
TF_DTYPES = {
    "float32": "DT_FLOAT",
    "float64": "DT_DOUBLE",
    "float16": "DT_HALF",
    "bfloat16": "DT_BFLOAT16",
    "int8": "DT_INT8",
    "int16": "DT_INT16",
    "int32": "DT_INT32",
    "int64": "DT_INT64",
    "uint8": "DT_UINT8",
    "uint16": "DT_UINT16",
    "uint32": "DT_UINT32",
    "uint64": "DT_UINT64",
    "bool": "DT_BOOL",
}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: its name, one sample's shape (no batch axis) and Keras's dtype name."""

    name: str
    shape: tuple
    dtype: str = "float32"

    @property
    def batch_shape(self) -> str:
        """``(None, 28, 28)``: the shape with the batch axis, as Keras prints it."""
        return "(" + ", ".join(["None"] + [str(d) for d in self.shape]) + ("," if not self.shape else "") + ")"

    def tensor_info(self) -> dict:
        """TensorFlow's TensorInfo as JSON (sizes are strings there: int64 in proto3's JSON)."""
        dims = [{"size": "-1", "name": ""}] + [{"size": str(d), "name": ""} for d in self.shape]
        return {
            "dtype": TF_DTYPES.get(self.dtype, "DT_FLOAT"),
            "tensor_shape": {"dim": dims, "unknown_rank": False},
            "name": f"{SIGNATURE_NAME}_{self.name}:0",
        }


class Signature:
    """The inputs and outputs of a malinn model, in the order ``predict`` takes and gives them.

    Args:
        model: a built :class:`~malinn.Sequential` or :class:`~malinn.Functional`.
    """

    def __init__(self, model):
        if hasattr(model, "inputs") and hasattr(model, "outputs"):  # Functional
            self.inputs = [TensorSpec(t.name, tuple(t.shape[1:]), t.dtype) for t in model.inputs]
            names = list(model.output_names) if model.output_names is not None else [t.name for t in model.outputs]
            self.outputs = [TensorSpec(n, tuple(t.shape[1:])) for n, t in zip(_distinct(names), model.outputs)]
            self._keyed = model.output_names is not None
        else:  # Sequential
            first = model.layers[0].name if model.layers else model.name
            dtype = getattr(model, "_input_dtype", "float32")
            self.inputs = [TensorSpec(f"{first}_input", tuple(model.input_shape[1:]), dtype)]
            last = model.layers[-1].name if model.layers else model.name
            self.outputs = [TensorSpec(last, tuple(model.output_shape[1:]))]
            self._keyed = False
        self.input_names = [spec.name for spec in self.inputs]

    def model_input(self, arrays: list) -> object:
        """What ``predict`` takes for ``arrays`` (one per input, in order): the array itself for one input."""
        return arrays[0] if len(arrays) == 1 else list(arrays)

    def output_arrays(self, result: object) -> list:
        """``predict``'s result (an array, a list, or a dict by output name) as a list in output order."""
        if isinstance(result, dict):
            return [np.asarray(result[spec.name]) for spec in self.outputs] if self._keyed else list(result.values())
        if isinstance(result, (list, tuple)):
            return [np.asarray(r) for r in result]
        return [np.asarray(result)]

    def signature_def(self) -> dict:
        """The ``serving_default`` SignatureDef as TensorFlow Serving's metadata API answers it."""
        return {
            "inputs": {s.name: s.tensor_info() for s in self.inputs},
            "outputs": {s.name: s.tensor_info() for s in self.outputs},
            "method_name": "tensorflow/serving/predict",
            "defaults": {},
        }


def _distinct(names: list) -> list:
    """``names`` with repeats numbered (a model giving one layer's output twice): ``dense``, ``dense_1``."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        n = seen.get(name, 0)
        seen[name] = n + 1
        out.append(name if n == 0 else f"{name}_{n}")
    return out
