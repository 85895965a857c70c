"""Embedding, SimpleRNN, LSTM and GRU: numpy references on odd shapes on every device, and Keras's
own outputs for models saved by Keras 3 and tf_keras (tests/layers/recurrent_zoo.py, run in a child
process: TensorFlow never shares this one)."""

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import built_zoo

import malinn
from malinn.errors import ConversionError, DeviceError
from malinn.layers import GRU, LSTM, Embedding, SimpleRNN

sys.path.insert(0, str(Path(__file__).parent))
import recurrent_reference as ref  # noqa: E402
from recurrent_zoo import MODELS  # noqa: E402
from zoo_files import GENERATIONS  # noqa: E402

CELLS = [(SimpleRNN, "simple_rnn", {}), (LSTM, "lstm", {}), (GRU, "gru", {}), (GRU, "gru", {"reset_after": False})]
#: (units, steps, features, batch, return_sequences, go_backwards)
SHAPES = [(13, 37, 5, 3, True, False), (1, 1, 1, 1, False, True), (4, 6, 3, 2, False, False), (7, 5, 2, 1, True, True)]


def _close(got, want):
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.nanmax(np.abs(want)))))


def _random_weights(layer, rng, scale=0.5):
    weights = [rng.uniform(-scale, scale, w.shape).astype(np.float32) for w in layer.get_weights()]
    layer.set_weights(weights)
    return weights


@pytest.mark.parametrize("cls,cell,options", CELLS, ids=["simple_rnn", "lstm", "gru", "gru_reset_before"])
@pytest.mark.parametrize(
    "shape", SHAPES, ids=lambda s: "u{}_t{}_f{}_b{}{}{}".format(*s[:4], "_seq" * s[4], "_back" * s[5])
)
def test_recurrence_equals_numpy(device, cls, cell, options, shape):
    units, steps, features, batch, sequences, backwards = shape
    rng = np.random.default_rng(units * 100 + steps)
    layer = cls(units, return_sequences=sequences, go_backwards=backwards, **options)
    x = malinn.Input((steps, features))
    model = malinn.Functional(x, layer(x))
    weights = _random_weights(layer, rng)
    xs = rng.standard_normal((batch, steps, features)).astype(np.float32)
    want = ref.recurrent(cell, xs, *weights, return_sequences=sequences, go_backwards=backwards, **options)[0]
    _close(model.predict(xs, verbose=0), want)


def test_lstm_return_state_and_mask_equal_numpy(device):
    rng = np.random.default_rng(3)
    emb = Embedding(6, 3, mask_zero=True)
    lstm = LSTM(
        5,
        return_sequences=True,
        return_state=True,
        activation="relu",
        recurrent_activation="hard_sigmoid",
        use_bias=False,
    )
    x = malinn.Input((7,))
    seq, h, c = lstm(emb(x))
    model = malinn.Functional(x, [seq, h, c])
    table = _random_weights(emb, rng)[0]
    weights = _random_weights(lstm, rng)
    xs = rng.integers(1, 6, (3, 7)).astype(np.float32)
    xs[0, 2:4] = 0
    xs[1] = 0  # every step masked: zeros out, zero state
    got = model.predict(xs, verbose=0)
    want = ref.recurrent(
        "lstm",
        ref.embedding(xs, table),
        *weights,
        activation="relu",
        recurrent_activation="hard_sigmoid",
        return_sequences=True,
        mask=xs,
    )
    for g, w in zip(got, want):
        _close(g, w)
    assert not got[0][1].any() and not got[2][1].any()


def test_embedding_equals_numpy_and_marks_indices_outside_the_table(device):
    layer = Embedding(7, 3)
    x = malinn.Input((2, 4))
    model = malinn.Functional(x, layer(x))
    table = _random_weights(layer, np.random.default_rng(1))[0]
    xs = np.array([[[0, 6, -1, 7], [1.7, -7, -8, 2]]], np.float32)
    got = model.predict(xs, verbose=0)
    assert got.shape == (1, 2, 4, 3)
    np.testing.assert_array_equal(got[0, 0, :3], table[[0, 6, 6]])  # -1: the last row (Keras 3's take)
    np.testing.assert_array_equal(got[0, 1, [0, 1, 3]], table[[1, 0, 2]])  # 1.7 truncated to 1
    assert np.isnan(got[0, 0, 3]).all() and np.isnan(got[0, 1, 2]).all()  # 7 and -8: outside the table


def test_validation_and_config():
    with pytest.raises(ValueError, match="units must be a positive integer"):
        LSTM(0)
    with pytest.raises(ValueError, match="not 'softmax'"):
        GRU(3, activation="softmax")
    with pytest.raises(ValueError, match="output_dim must be a positive integer"):
        Embedding(3, 0)
    # float32 indices are exact up to 2^24: a larger table would have rows no index reaches exactly
    assert Embedding(2**24, 2).input_dim == 2**24  # indices 0 to 2^24 - 1: every one exact
    with pytest.raises(ValueError, match=r"input_dim 16,777,217 is beyond 2\^24 .* would read another row"):
        Embedding(2**24 + 1, 2)
    assert np.float32(2**24 + 1) == np.float32(2**24)  # why: the index 2^24 + 1 reads row 2^24
    gru = GRU(4, reset_after=False, go_backwards=True, name="g")
    assert GRU.from_config(gru.get_config()).get_config() == gru.get_config()
    gru.build((None, 5, 2))
    assert [w.shape for w in gru.get_weights()] == [(2, 12), (4, 12), (12,)]
    assert [w.shape for w in GRU(4).get_weights() or []] == []
    lstm = LSTM(3)
    lstm.build((None, 2, 6))
    assert [w.shape for w in lstm.get_weights()] == [(6, 12), (3, 12), (12,)]


# ---------------------------------------------------------------------------------------------- Keras
@pytest.fixture(scope="session")
def recurrent_zoo(tmp_path_factory):
    """The zoo's folder (tests/layers/recurrent_zoo.py run once per test run in a child process)."""
    return built_zoo(
        tmp_path_factory, Path(__file__).with_name("recurrent_zoo.py"), "done", keep="MALINN_RECURRENT_ZOO"
    )


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("key", MODELS)
def test_equals_keras(recurrent_zoo, device, key, generation, suffix):
    data = np.load(recurrent_zoo / generation / f"{key}.npz")
    model = malinn.load_model(str(recurrent_zoo / generation / f"{key}{suffix}"))
    got = model.predict(data["x"], verbose=0)
    got = got if isinstance(got, list) else [got]
    want = [data[f"y{i}"] for i in range(len(data.files) - 1)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        _close(g, w)


def test_stateful_is_refused_by_name(recurrent_zoo, tmp_path):
    import json
    import shutil
    import zipfile

    source = recurrent_zoo / "keras3" / "emb_lstm.keras"
    target = tmp_path / "stateful.keras"
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename == "config.json":
                config = json.loads(data)
                for layer in config["config"]["layers"]:
                    if layer["class_name"] == "LSTM":
                        layer["config"]["stateful"] = True
                data = json.dumps(config).encode()
            zout.writestr(item, data)
    shutil.copy(target, tmp_path / "copy.keras")
    with pytest.raises(ConversionError, match="LSTM 'lstm' with stateful=True"):
        malinn.load_model(str(target))


@pytest.mark.parametrize("cls,cell,options", CELLS[:3], ids=["simple_rnn", "lstm", "gru"])
@pytest.mark.parametrize("units,steps", [(1, 3), (13, 5), (128, 4)])
def test_each_units_sums_split_over_items_equal_numpy(device, monkeypatch, cls, cell, options, units, steps):
    """The recurrence a GPU runs (kernels/recurrent.cl KS > 1: each unit's sums split over items that
    hold their rows of U in registers) on this device, with a mask and a sequence out: the same values."""
    monkeypatch.setattr(type(device), "kind", property(lambda self: "gpu"))
    rng = np.random.default_rng(units + steps)
    emb = Embedding(5, 3, mask_zero=True)
    layer = cls(units, return_sequences=True, **options)
    x = malinn.Input((steps,))
    model = malinn.Functional(x, layer(emb(x)))
    table = _random_weights(emb, rng)[0]
    weights = _random_weights(layer, rng)
    xs = rng.integers(1, 5, (3, steps)).astype(np.float32)
    xs[1, -1] = 0
    spec = next(s.spec for s in model.plan(3, device).steps if s.kind.name == "recurrent")
    assert int(spec.config["KS"]) == min(8, 1 << (units.bit_length() - 1)) > 1 or units == 1
    want = ref.recurrent(cell, ref.embedding(xs, table), *weights, return_sequences=True, mask=xs, **options)[0]
    _close(model.predict(xs, verbose=0), want)


#: devices whose driver ends a shader invocation's loops early (llvmpipe: after 65535 iterations in all)
LOOPS_END = [d for d in malinn.devices() if getattr(d, "max_loop_iterations", None)]


@pytest.mark.skipif(not LOOPS_END, reason="no device whose driver ends a shader's loops early (Mesa llvmpipe)")
def test_a_recurrence_longer_than_the_driver_runs_loops_is_refused_and_one_within_it_is_exact():
    """The GL recurrence runs every step in one invocation: on llvmpipe a sequence whose loops would
    pass the driver's limit (the library's loop_iterations bound) is refused by name rather than cut
    short, and one just within the bound equals numpy."""
    device = LOOPS_END[0]
    previous = malinn.get_device()
    malinn.set_device(device)
    try:
        rng = np.random.default_rng(9)
        for steps in (150, 400):  # the bound: 329 iterations a step for 64 SimpleRNN units
            layer = SimpleRNN(64, return_sequences=True)
            x = malinn.Input((steps, 3))
            model = malinn.Functional(x, layer(x))
            weights = _random_weights(layer, rng, scale=0.2)
            xs = rng.standard_normal((2, steps, 3)).astype(np.float32)
            if steps * 329 > device.max_loop_iterations:
                with pytest.raises(DeviceError, match=r"simple_rnn.* loop iterations in one shader invocation"):
                    model.predict(xs, verbose=0)
            else:
                want = ref.recurrent("simple_rnn", xs, *weights, return_sequences=True)[0]
                _close(model.predict(xs, verbose=0), want)
    finally:
        malinn.set_device(previous)
