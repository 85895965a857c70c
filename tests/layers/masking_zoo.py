"""Keras models of the Masking layer and of merges of differently masked inputs, saved by Keras 3
and tf_keras, with Keras's outputs.

TensorFlow never shares a process with PoCL: tests/layers/test_masking_layer.py runs this script in
a child process (once per test run):

    python3 tests/layers/masking_zoo.py OUTDIR

For each model of :data:`MODELS` and each generation (``keras3``, ``tf_keras``) it writes
``OUTDIR/<generation>/<key>.keras`` and ``.h5``, and ``<key>.npz`` holding ``x0``, ``x1``, ... (the
inputs) and ``y`` (Keras's output on them); then ``OUTDIR/done``. Every masked model has a sample
whose every step is masked.
"""

from __future__ import annotations

import sys
from pathlib import Path

from zoo_files import write_zoo

#: model keys (the tests parametrize over them)
MODELS = (
    "masking_lstm",
    "masking_gap_batch1",
    "masking_seq1",
    "masking_rank2",
    "masking_rank4_td_dense",
    "embeddings_added_lstm",
    "masking_embedding_concat_lstm",
    "masked_unmasked_added_gru",
    "embeddings_concat_lstm",
    "embeddings_concat_steps_gap",
    "embedding_unmasked_steps_concat_gap",
    "embedding_unmasked_concat_lstm",
)


def _indices(rng, batch: int, steps: int, vocabulary: int):
    """Indices with padding inside and a sample of padding only."""
    import numpy as np

    x = rng.integers(1, vocabulary, (batch, steps)).astype(np.float32)
    x[0, 1] = 0
    x[1, :] = 0
    x[2, steps - 2 :] = 0
    return x


def _sequences(rng, shape, value: float, masked: list):
    """Random sequences with the steps ``masked`` ((sample, step) pairs or a sample) set to ``value``."""
    import numpy as np

    x = rng.standard_normal(shape).astype(np.float32)
    for where in masked:
        x[where] = value
    return x


def build(keras, key: str):
    """Model ``key`` built with ``keras`` (keras or tf_keras) and its inputs."""
    import numpy as np

    rng = np.random.default_rng(7)
    layers = keras.layers
    if key == "masking_lstm":  # mask value 0.5; a step with one feature equal to it is kept
        inp = keras.Input((5, 3))
        out = layers.LSTM(4, return_sequences=True)(layers.Masking(mask_value=0.5)(inp))
        x = _sequences(rng, (3, 5, 3), 0.5, [(0, 1), 1, (2, slice(3, None))])
        x[2, 0, 0] = 0.5
        xs = [x]
    elif key == "masking_gap_batch1":  # a masked mean, batch 1
        inp = keras.Input((4, 2))
        out = layers.GlobalAveragePooling1D()(layers.Masking(mask_value=-1.0)(inp))
        xs = [_sequences(rng, (1, 4, 2), -1.0, [(0, 2)])]
    elif key == "masking_seq1":  # sequence length 1, one unit, a sample whose only step is masked
        inp = keras.Input((1, 2))
        out = layers.GRU(1, return_sequences=True)(layers.Masking()(inp))
        xs = [_sequences(rng, (2, 1, 2), 0.0, [1])]
    elif key == "masking_rank2":  # one mask per sample: the output zeroed where all features are 0
        inp = keras.Input((6,))
        out = layers.Dense(3)(layers.Masking()(inp))
        xs = [_sequences(rng, (3, 6), 0.0, [1])]
    elif key == "masking_rank4_td_dense":  # a mask of (batch, steps, rows), passed on by TimeDistributed
        inp = keras.Input((4, 3, 2))
        out = layers.TimeDistributed(layers.Dense(2))(layers.Masking()(inp))
        xs = [_sequences(rng, (2, 4, 3, 2), 0.0, [(0, 1), (1, slice(None), 2)])]
    elif key == "embeddings_added_lstm":  # two masks ANDed (tf_keras) or ORed (Keras 3)
        a, b = keras.Input((6,)), keras.Input((6,))
        h = layers.Add()([layers.Embedding(7, 3, mask_zero=True)(a), layers.Embedding(7, 3, mask_zero=True)(b)])
        out = layers.LSTM(2, return_sequences=True)(h)
        xa, xb = _indices(rng, 4, 6, 7), _indices(rng, 4, 6, 7)
        xb[0, :3] = 0
        xb[3, 2] = 0
        xs, inp = [xa, xb], [a, b]
    elif key == "masking_embedding_concat_lstm":  # a Masking branch beside an Embedding branch
        a, b = keras.Input((5, 2)), keras.Input((5,))
        h = layers.Concatenate()([layers.Masking(mask_value=0.25)(a), layers.Embedding(6, 3, mask_zero=True)(b)])
        out = layers.LSTM(3)(h)
        xs, inp = [_sequences(rng, (3, 5, 2), 0.25, [(0, 3), (2, 0)]), _indices(rng, 3, 5, 6)], [a, b]
    elif key == "masked_unmasked_added_gru":  # tf_keras: the one mask; Keras 3: none
        a, b = keras.Input((5, 3)), keras.Input((5, 3))
        out = layers.GRU(2)(layers.Add()([layers.Masking()(a), b]))
        xs, inp = [_sequences(rng, (3, 5, 3), 0.0, [(0, 2), 1]), _sequences(rng, (3, 5, 3), 0.0, [])], [a, b]
    elif key == "embeddings_concat_lstm":  # two masks along the features: ANDed (tf_keras), ORed (Keras 3)
        a, b = keras.Input((6,)), keras.Input((6,))
        h = layers.Concatenate()([layers.Embedding(7, 3, mask_zero=True)(a), layers.Embedding(7, 2, mask_zero=True)(b)])
        out = layers.LSTM(2)(h)
        xa, xb = _indices(rng, 4, 6, 7), _indices(rng, 4, 6, 7)
        xb[0, :3] = 0
        xs, inp = [xa, xb], [a, b]
    elif key == "embeddings_concat_steps_gap":  # two masks joined along the steps
        a, b = keras.Input((4,)), keras.Input((3,))
        embed = layers.Embedding(6, 2, mask_zero=True)
        out = layers.GlobalAveragePooling1D()(layers.Concatenate(axis=1)([embed(a), embed(b)]))
        xs, inp = [_indices(rng, 3, 4, 6), _indices(rng, 3, 3, 6)], [a, b]
    elif key == "embedding_unmasked_steps_concat_gap":  # an input without a mask: its steps all kept
        a, b = keras.Input((5,)), keras.Input((2, 1))
        h = layers.Concatenate(axis=1)([layers.Embedding(6, 1, mask_zero=True)(a), b])
        out = layers.GlobalAveragePooling1D()(h)
        xs, inp = [_indices(rng, 3, 5, 6), _sequences(rng, (3, 2, 1), 0.0, [(0, 1)])], [a, b]
    elif key == "embedding_unmasked_concat_lstm":  # tf_keras: the one mask; Keras 3: all kept
        a, b = keras.Input((5,)), keras.Input((5, 2))
        h = layers.Concatenate()([layers.Embedding(6, 2, mask_zero=True)(a), b])
        out = layers.LSTM(3, return_sequences=True)(h)
        xs, inp = [_indices(rng, 3, 5, 6), _sequences(rng, (3, 5, 2), 0.0, [(2, 1)])], [a, b]
    else:
        raise KeyError(key)
    model = keras.Model(inp, out)
    for layer in model.layers:
        layer.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype(np.float32) for w in layer.get_weights()])
    return model, xs


def _one_or_several(keras, key: str):
    model, xs = build(keras, key)
    return model, xs if len(xs) > 1 else xs[0]


def _arrays(x, ys: list) -> dict:
    return {"y": ys[0], **{f"x{i}": v for i, v in enumerate(x if isinstance(x, list) else [x])}}


def main(out: Path) -> None:
    write_zoo(out, MODELS, _one_or_several, _arrays)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
