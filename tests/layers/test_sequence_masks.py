"""Bidirectional, TimeDistributed and Keras's masks reaching pooling and attention: numpy references
on odd shapes on every device, and Keras's own outputs for models saved by Keras 3 and tf_keras
(tests/layers/sequence_zoo.py, run in a child process: TensorFlow never shares this one)."""

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import built_zoo

import malinn
from malinn.layers import GRU, LSTM, Bidirectional, Dense, Embedding, GlobalAveragePooling1D, SimpleRNN

sys.path.insert(0, str(Path(__file__).parent))
import recurrent_reference as ref  # noqa: E402
from sequence_zoo import MODELS  # noqa: E402
from zoo_files import GENERATIONS  # noqa: E402

MERGES = {
    "concat": lambda f, b: [np.concatenate([f, b], -1)],
    "sum": lambda f, b: [f + b],
    "mul": lambda f, b: [f * b],
    "ave": lambda f, b: [(f + b) / 2],
    None: lambda f, b: [f, b],
}


def _close(got, want):
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.nanmax(np.abs(want)))))


def _random_weights(layer, rng, scale=0.5):
    weights = [rng.uniform(-scale, scale, w.shape).astype(np.float32) for w in layer.get_weights()]
    layer.set_weights(weights)
    return weights


def _indices(rng, batch, steps, vocabulary):
    x = rng.integers(1, vocabulary, (batch, steps)).astype(np.float32)
    x[0, steps // 2 :] = 0
    if batch > 1:
        x[1] = 0  # every step masked
    return x


@pytest.mark.parametrize("merge_mode", list(MERGES), ids=str)
@pytest.mark.parametrize(
    "cls,cell", [(SimpleRNN, "simple_rnn"), (LSTM, "lstm"), (GRU, "gru")], ids=["simple_rnn", "lstm", "gru"]
)
@pytest.mark.parametrize(
    "shape", [(3, 7, 3, True), (1, 1, 1, False), (5, 4, 2, True)], ids=["u3_t7_b3_seq", "u1_t1_b1", "u5_t4_b2_seq"]
)
def test_bidirectional_equals_numpy(device, cls, cell, merge_mode, shape):
    """Both directions, masked (a sample of masked steps only), states returned, every merge."""
    units, steps, batch, sequences = shape
    rng = np.random.default_rng(units * 10 + steps)
    emb = Embedding(6, 2, mask_zero=True)
    bi = Bidirectional(cls(units, return_sequences=sequences, return_state=True), merge_mode=merge_mode)
    x = malinn.Input((steps,))
    model = malinn.Functional(x, bi(emb(x)))
    table = _random_weights(emb, rng)[0]
    weights = _random_weights(bi, rng)
    xs = _indices(rng, batch, steps, 6)
    e, half = ref.embedding(xs, table), len(weights) // 2
    forward = ref.recurrent(
        cell, e, *weights[:half], return_sequences=sequences, mask=xs, zero_output_for_mask=sequences
    )
    backward = ref.recurrent(
        cell, e, *weights[half:], return_sequences=sequences, mask=xs, zero_output_for_mask=sequences, go_backwards=True
    )
    back = backward[0][:, ::-1] if sequences else backward[0]  # Keras flips the backward sequence back
    states = [forward[1], forward[2], backward[1], backward[2]] if cell == "lstm" else [forward[1], backward[1]]
    want = MERGES[merge_mode](forward[0], back) + states
    got = model.predict(xs, verbose=0)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        _close(g, w)


def test_masked_average_pooling_equals_numpy(device):
    """The mask passes through Dense to the mean over the kept steps; all masked: NaN, as Keras."""
    rng = np.random.default_rng(5)
    emb, dense = Embedding(9, 4, mask_zero=True), Dense(3)
    x = malinn.Input((5,))
    model = malinn.Functional(x, GlobalAveragePooling1D()(dense(emb(x))))
    table = _random_weights(emb, rng)[0]
    kernel, bias = _random_weights(dense, rng)
    xs = _indices(rng, 3, 5, 9)
    h = ref.embedding(xs, table) @ kernel + bias
    kept = (xs != 0)[:, :, None]
    with np.errstate(invalid="ignore"):
        want = (h * kept).sum(1) / kept.sum(1)
    assert np.isnan(want[1]).all()
    _close(model.predict(xs, verbose=0), want)


def test_bidirectional_validation_and_config():
    with pytest.raises(ValueError, match="merge_mode must be one of"):
        Bidirectional(LSTM(2), merge_mode="max")
    with pytest.raises(ValueError, match="wraps a SimpleRNN, LSTM or GRU"):
        Bidirectional(Dense(2))
    with pytest.raises(ValueError, match="both have go_backwards=False"):
        Bidirectional(LSTM(2), backward_layer=LSTM(2))
    with pytest.raises(ValueError, match="differ in return_sequences"):
        Bidirectional(LSTM(2), backward_layer=LSTM(2, go_backwards=True, return_sequences=True))
    bi = Bidirectional(GRU(3, reset_after=False), merge_mode=None, name="bi")
    again = Bidirectional.from_config(bi.get_config())
    assert again.get_config() == bi.get_config() and again.backward_layer.go_backwards
    bi.build((None, 4, 2))
    assert [w.shape for w in bi.get_weights()] == [(2, 9), (3, 9), (9,)] * 2
    assert bi.compute_output_shape((None, 4, 2)) == [(None, 3), (None, 3)]


# ---------------------------------------------------------------------------------------------- Keras
@pytest.fixture(scope="session")
def sequence_zoo(tmp_path_factory):
    """The zoo's folder (tests/layers/sequence_zoo.py run once per test run in a child process)."""
    return built_zoo(tmp_path_factory, Path(__file__).with_name("sequence_zoo.py"), "done", keep="MALINN_SEQUENCE_ZOO")


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("key", MODELS)
def test_equals_keras(sequence_zoo, device, key, generation, suffix):
    data = np.load(sequence_zoo / generation / f"{key}.npz")
    xs = [data[k] for k in sorted(data.files) if k.startswith("x")]
    want = [data[k] for k in sorted((k for k in data.files if k.startswith("y")), key=lambda k: int(k[1:]))]
    model = malinn.load_model(str(sequence_zoo / generation / f"{key}{suffix}"))
    got = model.predict(xs if len(xs) > 1 else xs[0], verbose=0)
    got = got if isinstance(got, list) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        _close(g, w)
