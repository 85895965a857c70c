"""ConvLSTM1D and ConvLSTM2D: a numpy reference on odd shapes on every device, and Keras's own
outputs for models saved by Keras 3 and tf_keras (tests/layers/conv_lstm_zoo.py, run in a child
process: TensorFlow never shares this one)."""

import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import built_zoo

import malinn
from malinn.errors import ConversionError
from malinn.layers import ConvLSTM1D, ConvLSTM2D, ConvLSTM3D

sys.path.insert(0, str(Path(__file__).parent))
import conv_lstm_reference as ref  # noqa: E402
from conv_lstm_zoo import MODELS  # noqa: E402
from zoo_files import GENERATIONS  # noqa: E402

#: (class, filters, steps, spatial, channels, kernel, padding, strides, batch, options)
SHAPES = [
    (ConvLSTM2D, 1, 1, (5, 4), 2, 3, "valid", 1, 1, {"return_sequences": True}),
    (ConvLSTM2D, 3, 3, (7, 5), 1, 1, "same", 2, 2, {"go_backwards": True}),
    (ConvLSTM2D, 2, 3, (6, 6), 3, 3, "same", 1, 1, {"return_sequences": True, "return_state": True}),
    (ConvLSTM2D, 1, 3, (5, 7), 2, (3, 1), "valid", 2, 1, {"recurrent_activation": "hard_sigmoid"}),
    (ConvLSTM1D, 1, 3, (9,), 2, 3, "valid", 2, 1, {"return_sequences": True, "go_backwards": True}),
    (ConvLSTM1D, 4, 1, (5,), 1, 1, "same", 1, 3, {"return_state": True, "use_bias": False, "activation": "relu"}),
    (ConvLSTM3D, 1, 1, (1, 1, 1), 1, 1, "valid", 1, 1, {"return_state": True}),
    (ConvLSTM3D, 3, 3, (3, 4, 5), 2, (2, 3, 2), "same", 1, 2, {"return_sequences": True, "go_backwards": True}),
    (
        ConvLSTM3D,
        1,
        2,
        (5, 3, 4),
        3,
        (3, 1, 2),
        "valid",
        (2, 1, 2),
        3,
        {"return_sequences": True, "return_state": True},
    ),
    (ConvLSTM3D, 2, 13, (1, 3, 1), 1, 3, "same", 1, 1, {"use_bias": False, "recurrent_activation": "hard_sigmoid"}),
]


def _close(got, want):
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.nanmax(np.abs(want)))))


def _model(layer, sample):
    x = malinn.Input(sample)
    y = layer(x)
    return malinn.Functional(x, y)


@pytest.mark.parametrize(
    "case",
    SHAPES,
    ids=lambda s: f"{s[0].__name__}_f{s[1]}_t{s[2]}_{'x'.join(map(str, s[3]))}_k{s[5]}_{s[6]}_s{s[7]}_b{s[8]}",
)
def test_conv_lstm_equals_numpy(device, case):
    cls, filters, steps, spatial, channels, kernel, padding, strides, batch, options = case
    rng = np.random.default_rng(filters * 10 + steps)
    layer = cls(filters, kernel, strides=strides, padding=padding, **options)
    model = _model(layer, (steps,) + spatial + (channels,))
    weights = [rng.uniform(-0.6, 0.6, w.shape).astype(np.float32) for w in layer.get_weights()]
    layer.set_weights(weights)
    xs = rng.standard_normal((batch, steps) + spatial + (channels,)).astype(np.float32)
    if not options.get("use_bias", True):
        weights.append(None)
    want = ref.conv_lstm(
        xs,
        *weights,
        strides=strides,
        padding=padding,
        activation=options.get("activation", "tanh"),
        recurrent_activation=options.get("recurrent_activation", "sigmoid"),
        return_sequences=options.get("return_sequences", False),
        go_backwards=options.get("go_backwards", False),
    )
    got = model.predict(xs, verbose=0)
    if options.get("return_state"):
        assert len(got) == 3
        for g, w in zip(got, want):
            _close(g, w)
    else:
        _close(got, want[0])


def test_validation_config_and_saving(tmp_path):
    with pytest.raises(ValueError, match="filters must be a positive integer"):
        ConvLSTM2D(0, 3)
    with pytest.raises(ValueError, match="cannot be combined"):
        ConvLSTM2D(2, 3, strides=2, dilation_rate=2)
    with pytest.raises(ValueError, match="not 'softmax'"):
        ConvLSTM1D(2, 3, activation="softmax")
    with pytest.raises(ValueError, match="padding must be 'valid' or 'same'"):
        ConvLSTM1D(2, 3, padding="causal")
    layer = ConvLSTM2D(3, (3, 2), padding="same", go_backwards=True, return_state=True, name="cl")
    assert ConvLSTM2D.from_config(layer.get_config()).get_config() == layer.get_config()
    model = _model(layer, (2, 5, 4, 2))
    assert [w.shape for w in layer.get_weights()] == [(3, 2, 2, 12), (3, 2, 3, 12), (12,)]
    assert layer.get_weights()[2][3:6].tolist() == [1.0] * 3  # unit_forget_bias: the forget gate's 1
    assert layer.compute_output_shape((None, 2, 5, 4, 2)) == [(None, 5, 4, 3)] * 3
    with pytest.raises(ValueError, match="takes inputs"):
        layer.compute_output_shape((None, 5, 4, 2))
    rng = np.random.default_rng(5)
    layer.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype(np.float32) for w in layer.get_weights()])
    xs = rng.standard_normal((1, 2, 5, 4, 2)).astype(np.float32)
    model.save(tmp_path / "cl.malinn")
    again = malinn.load_model(str(tmp_path / "cl.malinn"))
    for g, w in zip(again.predict(xs, verbose=0), model.predict(xs, verbose=0)):
        np.testing.assert_array_equal(g, w)


# ---------------------------------------------------------------------------------------------- Keras
@pytest.fixture(scope="session")
def conv_lstm_zoo(tmp_path_factory):
    """The zoo's folder (tests/layers/conv_lstm_zoo.py run once per test run in a child process)."""
    return built_zoo(
        tmp_path_factory, Path(__file__).with_name("conv_lstm_zoo.py"), "done", keep="MALINN_CONV_LSTM_ZOO"
    )


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("key", MODELS)
def test_equals_keras(conv_lstm_zoo, device, key, generation, suffix):
    data = np.load(conv_lstm_zoo / generation / f"{key}.npz")
    model = malinn.load_model(str(conv_lstm_zoo / generation / f"{key}{suffix}"))
    got = model.predict(data["x"], verbose=0)
    got = got if isinstance(got, list) else [got]
    want = [data[f"y{i}"] for i in range(len(data.files) - 1)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        _close(g, w)


def _edited(source: Path, target: Path, edit) -> Path:
    """A copy of the Keras 3 file ``source`` whose ConvLSTM layer config ``edit`` changed."""
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename == "config.json":
                config = json.loads(data)
                for layer in config["config"]["layers"]:
                    if layer["class_name"].startswith("ConvLSTM"):
                        edit(layer)
                data = json.dumps(config).encode()
            zout.writestr(item, data)
    return target


def test_stateful_and_channels_first_are_refused_by_name(conv_lstm_zoo, tmp_path):
    source = conv_lstm_zoo / "keras3" / "conv1d_state_back.keras"
    edits = {
        "stateful": (
            lambda layer: layer["config"].update(stateful=True),
            "ConvLSTM1D 'conv_lstm_states' with stateful",
        ),
        "channels_first": (
            lambda layer: layer["config"].update(data_format="channels_first"),
            "ConvLSTM1D 'conv_lstm_states' with data_format='channels_first'",
        ),
    }
    for name, (edit, message) in edits.items():
        with pytest.raises(ConversionError, match=message):
            malinn.load_model(str(_edited(source, tmp_path / f"{name}.keras", edit)))
