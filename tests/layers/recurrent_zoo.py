"""Keras models of Embedding and the recurrent layers, saved by Keras 3 and tf_keras, with Keras's outputs.

TensorFlow never shares a process with PoCL: tests/layers/test_recurrent.py runs this script in a
child process (once per test run):

    python3 tests/layers/recurrent_zoo.py OUTDIR

For each model of :data:`MODELS` and each generation (``keras3``, ``tf_keras``) it writes
``OUTDIR/<generation>/<key>.keras`` and ``.h5``, and ``<key>.npz`` holding ``x`` (the input) and
``y0``, ``y1``, ... (Keras's outputs on it); then ``OUTDIR/done``. Weights are drawn at random
(biases too, so that every bias path is checked).
"""

from __future__ import annotations

import sys
from pathlib import Path

from zoo_files import write_zoo

#: model keys (the tests parametrize over them)
MODELS = ("emb_lstm", "emb_mask_gru", "lstm_state", "gru_before_back", "rnn_one", "stacked", "gru_state_back")


def build(keras, key: str):
    """Model ``key`` built with ``keras`` (keras or tf_keras) and its input batch."""
    import numpy as np

    rng = np.random.default_rng(7)
    layers = keras.layers
    if key == "emb_lstm":
        inp = keras.Input((7,))
        out = layers.LSTM(5)(layers.Embedding(11, 4)(inp))
        x = rng.integers(0, 11, (3, 7)).astype(np.float32)
    elif key == "emb_mask_gru":
        inp = keras.Input((6,))
        h = layers.GRU(4, return_sequences=True)(layers.Embedding(9, 3, mask_zero=True)(inp))
        out = layers.LSTM(3)(h)
        x = rng.integers(1, 9, (4, 6)).astype(np.float32)
        x[0, [1, 4]] = 0  # masked steps inside
        x[1, :] = 0  # a sample of masked steps only
        x[2, :3] = 0  # leading padding
        x[3, 4:] = 0  # trailing padding
    elif key == "lstm_state":
        inp = keras.Input((6, 2))
        out = layers.LSTM(4, return_sequences=True, return_state=True, name="lstm_states")(inp)
        x = rng.standard_normal((2, 6, 2)).astype(np.float32)
    elif key == "gru_before_back":
        inp = keras.Input((5, 2))
        out = layers.GRU(
            3,
            reset_after=False,
            go_backwards=True,
            return_sequences=True,
            activation="relu",
            recurrent_activation="hard_sigmoid",
        )(inp)
        x = rng.standard_normal((2, 5, 2)).astype(np.float32)
    elif key == "rnn_one":
        inp = keras.Input((1, 1))
        out = layers.SimpleRNN(1, go_backwards=True, use_bias=False, unroll=True)(inp)
        x = rng.standard_normal((1, 1, 1)).astype(np.float32)
    elif key == "stacked":
        inp = keras.Input((37, 3))
        h = layers.LSTM(13, return_sequences=True, dropout=0.3, recurrent_dropout=0.2)(inp)
        out = layers.SimpleRNN(3, activation="relu")(layers.Dropout(0.5)(h))
        x = rng.standard_normal((2, 37, 3)).astype(np.float32)
    elif key == "gru_state_back":
        inp = keras.Input((4, 3))
        out = layers.GRU(2, go_backwards=True, return_state=True)(inp)
        x = rng.standard_normal((1, 4, 3)).astype(np.float32)
    else:
        raise KeyError(key)
    model = keras.Model(inp, list(out) if isinstance(out, (list, tuple)) else out)
    for layer in model.layers:
        layer.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype(np.float32) for w in layer.get_weights()])
    return model, x


def main(out: Path) -> None:
    write_zoo(out, MODELS, build)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
