"""Keras models of Bidirectional, TimeDistributed, Masking and the layers a mask reaches (pooling,
attention), saved by Keras 3 and tf_keras, with Keras's outputs.

``masking_lstm`` (Keras's Masking layer) is built on request only: malinn refuses Masking by name.

TensorFlow never shares a process with PoCL: tests/layers/test_sequence_masks.py runs this script
in a child process (once per test run):

    python3 tests/layers/sequence_zoo.py OUTDIR [KEY ...]

For each model of :data:`MODELS` (or the keys given) and each generation (``keras3``,
``tf_keras``) it writes ``OUTDIR/<generation>/<key>.keras`` and ``.h5``, and ``<key>.npz`` holding
``x`` (the input) and ``y0``, ``y1``, ... (Keras's outputs on it); then ``OUTDIR/done``. Every
masked model has a sample whose every step is masked.
"""

from __future__ import annotations

import sys
from pathlib import Path

from zoo_files import write_zoo

#: model keys (the tests parametrize over them)
MODELS = (
    "bi_lstm_concat",
    "bi_gru_none_state",
    "bi_rnn_mul_one",
    "bi_lstm_ave_state",
    "bi_backward_layer",
    "bi_gru_sum_masked",
    "td_dense_mask",
    "gap_mask",
    "mha_mask",
    "attention_mask",
)


def _indices(rng, batch: int, steps: int, vocabulary: int):
    """Indices with padding inside, leading and trailing, and a sample of padding only."""
    import numpy as np

    x = rng.integers(1, vocabulary, (batch, steps)).astype(np.float32)
    x[0, [1, steps - 2]] = 0
    x[1, :] = 0
    x[2, :2] = 0
    if batch > 3:
        x[3, steps - 2 :] = 0
    return x


def build(keras, key: str):
    """Model ``key`` built with ``keras`` (keras or tf_keras) and its input batch."""
    import numpy as np

    rng = np.random.default_rng(11)
    layers = keras.layers
    if key == "bi_lstm_concat":  # masked, both ways return_sequences, stacked on another Bidirectional
        inp = keras.Input((7,))
        h = layers.Bidirectional(layers.LSTM(3, return_sequences=True))(layers.Embedding(9, 4, mask_zero=True)(inp))
        out = layers.Bidirectional(layers.GRU(2), merge_mode="concat")(h)
        x = _indices(rng, 4, 7, 9)
    elif key == "bi_gru_none_state":
        inp = keras.Input((5, 2))
        out = layers.Bidirectional(layers.GRU(3, return_sequences=True, return_state=True), merge_mode=None)(inp)
        x = rng.standard_normal((2, 5, 2)).astype(np.float32)
    elif key == "bi_rnn_mul_one":  # sequence length 1, batch 1, one unit
        inp = keras.Input((1, 3))
        out = layers.Bidirectional(layers.SimpleRNN(1, return_sequences=True), merge_mode="mul")(inp)
        x = rng.standard_normal((1, 1, 3)).astype(np.float32)
    elif key == "bi_lstm_ave_state":
        inp = keras.Input((6, 3))
        out = layers.Bidirectional(layers.LSTM(4, return_state=True, use_bias=False), merge_mode="ave")(inp)
        x = rng.standard_normal((3, 6, 3)).astype(np.float32)
    elif key == "bi_backward_layer":
        inp = keras.Input((5, 2))
        back = layers.GRU(3, return_sequences=True, go_backwards=True, reset_after=False, activation="relu")
        out = layers.Bidirectional(layers.GRU(3, return_sequences=True), backward_layer=back, merge_mode="sum")(inp)
        x = rng.standard_normal((2, 5, 2)).astype(np.float32)
    elif key == "bi_gru_sum_masked":  # last states of masked sequences, summed
        inp = keras.Input((6,))
        out = layers.Bidirectional(layers.GRU(5), merge_mode="sum")(layers.Embedding(8, 3, mask_zero=True)(inp))
        x = _indices(rng, 4, 6, 8)
    elif key == "td_dense_mask":  # the mask passes through TimeDistributed(Dense) and Dense to the LSTM
        inp = keras.Input((6,))
        h = layers.TimeDistributed(layers.Dense(4, activation="tanh"))(layers.Embedding(7, 3, mask_zero=True)(inp))
        out = layers.LSTM(3, return_sequences=True)(layers.Dense(5)(h))
        x = _indices(rng, 4, 6, 7)
    elif key == "masking_lstm":
        inp = keras.Input((5, 3))
        out = layers.LSTM(4)(layers.Masking(mask_value=0.5)(inp))
        x = rng.standard_normal((3, 5, 3)).astype(np.float32)
        x[0, 1] = 0.5
        x[1, :] = 0.5  # every step masked
        x[2, 3:] = 0.5
        x[2, 0, 0] = 0.5  # one feature equal to mask_value: the step is kept
    elif key == "gap_mask":
        inp = keras.Input((6,))
        h = layers.Embedding(9, 4, mask_zero=True)(inp)
        out = layers.Dense(2)(layers.GlobalAveragePooling1D()(h))
        x = _indices(rng, 4, 6, 9)
    elif key == "mha_mask":  # self-attention of a masked sequence; its output mask reaches the pooling
        inp = keras.Input((5,))
        h = layers.Embedding(8, 6, mask_zero=True)(inp)
        a = layers.MultiHeadAttention(2, 3)(h, h)
        out = layers.GlobalAveragePooling1D()(layers.Add()([h, a]))
        x = _indices(rng, 4, 5, 8)
    elif key == "attention_mask":  # query and value masks from two Embeddings
        q_in, v_in = keras.Input((4,)), keras.Input((5,))
        q = layers.Embedding(7, 3, mask_zero=True)(q_in)
        v = layers.Embedding(7, 3, mask_zero=True)(v_in)
        out = layers.Attention()([q, v])
        x = [_indices(rng, 4, 4, 7), _indices(rng, 4, 5, 7)]
        x[1][2] = 0  # the third sample's values all masked
        inp = [q_in, v_in]
    else:
        raise KeyError(key)
    model = keras.Model(inp, list(out) if isinstance(out, (list, tuple)) else out)
    for layer in model.layers:
        layer.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype(np.float32) for w in layer.get_weights()])
    return model, x


def main(out: Path, keys: list) -> None:
    write_zoo(out, keys or MODELS, build)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
