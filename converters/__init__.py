"""Readers of Keras model files (installed as ``malinn.converters``).

``read_keras(path)`` reads a Keras 3 ``.keras`` archive, a Keras 3 legacy ``.h5`` or a
Keras 2 / tf_keras ``.h5``, and ``read_keras(architecture_json, weights=file)`` a model saved as
``model.to_json()`` plus ``model.save_weights()``, with numpy, h5py, json and zipfile only (never
TensorFlow or Keras), and returns a :class:`KerasModel`: the chain of layers with their configs and float32
weights in Keras's order. It never runs code from the file (custom objects are refused by name)
and checks declared sizes before reading. Every problem with the file raises
:class:`malinn.errors.ConversionError`.
"""

from .model_spec import FORMATS, KerasLayer, KerasModel
from .reader import read_keras

__all__ = ["FORMATS", "KerasLayer", "KerasModel", "read_keras"]
