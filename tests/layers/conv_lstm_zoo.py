"""Keras models of ConvLSTM1D, ConvLSTM2D and ConvLSTM3D, saved by Keras 3 and tf_keras, with Keras's outputs.

TensorFlow never shares a process with PoCL: tests/layers/test_conv_lstm.py runs this script in a
child process (once per test run):

    python3 tests/layers/conv_lstm_zoo.py OUTDIR

For each model of :data:`MODELS` and each generation (``keras3``, ``tf_keras``) it writes
``OUTDIR/<generation>/<key>.keras`` and ``.h5``, and ``<key>.npz`` holding ``x`` (the input) and
``y0``, ``y1``, ... (Keras's outputs on it); then ``OUTDIR/done``. Weights are drawn at random
(biases too, and a BatchNormalization's statistics).
"""

from __future__ import annotations

import sys
from pathlib import Path

from zoo_files import write_zoo

#: model keys (the tests parametrize over them)
MODELS = ("next_frame", "conv1d_state_back", "dilated_one_step", "conv3d_state_back", "conv3d_valid_strided")


def build(keras, key: str):
    """Model ``key`` built with ``keras`` (keras or tf_keras) and its input batch."""
    import numpy as np

    rng = np.random.default_rng(11)
    layers = keras.layers
    if key == "next_frame":  # keras.io's next-frame prediction, small: a sequence of frames to one frame
        inp = keras.Input((3, 7, 5, 2))
        h = layers.ConvLSTM2D(4, (3, 3), padding="same", return_sequences=True, activation="relu")(inp)
        h = layers.BatchNormalization()(h)
        h = layers.ConvLSTM2D(3, (1, 1), padding="same", return_sequences=False, dropout=0.2)(h)
        out = layers.Conv2D(1, (3, 3), activation="sigmoid", padding="same")(h)
        x = rng.standard_normal((2, 3, 7, 5, 2)).astype(np.float32)
    elif key == "conv1d_state_back":
        inp = keras.Input((4, 9, 2))
        out = layers.ConvLSTM1D(
            3,
            3,
            strides=2,
            return_sequences=True,
            return_state=True,
            go_backwards=True,
            recurrent_activation="sigmoid",
            name="conv_lstm_states",
        )(inp)
        x = rng.standard_normal((1, 4, 9, 2)).astype(np.float32)
    elif key == "dilated_one_step":
        inp = keras.Input((1, 6, 6, 3))
        out = layers.ConvLSTM2D(
            1, 2, dilation_rate=2, padding="same", use_bias=False, recurrent_activation="hard_sigmoid"
        )(inp)
        x = rng.standard_normal((3, 1, 6, 6, 3)).astype(np.float32)
    elif key == "conv3d_state_back":  # volumes, 'same', every output and state, steps from the last
        inp = keras.Input((3, 3, 4, 3, 2))
        out = layers.ConvLSTM3D(
            2, (2, 3, 2), padding="same", return_sequences=True, return_state=True, go_backwards=True
        )(inp)
        x = rng.standard_normal((2, 3, 3, 4, 3, 2)).astype(np.float32)
    elif key == "conv3d_valid_strided":  # 'valid' and strided, then a Dense on the last state
        inp = keras.Input((2, 5, 4, 3, 1))
        h = layers.ConvLSTM3D(3, 2, strides=(2, 1, 1), recurrent_activation="hard_sigmoid")(inp)
        out = layers.Dense(2)(layers.Flatten()(h))
        x = rng.standard_normal((1, 2, 5, 4, 3, 1)).astype(np.float32)
    else:
        raise KeyError(key)
    model = keras.Model(inp, list(out) if isinstance(out, (list, tuple)) else out)
    for layer in model.layers:
        weights = layer.get_weights()
        if type(layer).__name__ == "BatchNormalization":  # gamma, beta, mean, variance (> 0)
            layer.set_weights([rng.uniform(0.5, 1.5, w.shape).astype(np.float32) for w in weights])
        else:
            layer.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype(np.float32) for w in weights])
    return model, x


def main(out: Path) -> None:
    write_zoo(out, MODELS, build)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
