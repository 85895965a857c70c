"""malinn.convert / malinn.load_model on files that are not (supported) models.

Every failure must raise ``malinn.ConversionError`` (a ``ValueError``) whose message names the
file and the cause, and must leave nothing behind: no destination file, no temporary file beside
it, other files of its folder and a previous destination untouched. Keras files come from the zoo
(tests/keras_zoo.py); corrupt ones are made here with h5py and zipfile (no TensorFlow here).
"""

from __future__ import annotations

import errno
import os
import pathlib
import zipfile

import h5py
import numpy as np
import pytest

import malinn
from malinn import ConversionError

FORMAT_PARAMS = [pytest.param(fmt, id=fmt) for fmt in ("keras3-zip", "keras3-h5", "keras2-h5", "tf_keras-zip")]
ZIP_FORMATS = [pytest.param("keras3-zip", id="keras3"), pytest.param("tf_keras-zip", id="tf_keras")]
H5_FORMATS = [pytest.param("keras3-h5", id="keras3"), pytest.param("keras2-h5", id="tf_keras")]
PREVIOUS = b"a previous model file that a failed conversion must not touch\n"


# ---------------------------------------------------------------------------------------------
# shared steps


def snapshot(folder):
    return {p.name: p.read_bytes() for p in pathlib.Path(folder).iterdir() if p.is_file()}


def assert_convert_fails(src, out_dir, *fragments, any_of=()):
    """convert(src, ...) fails cleanly, into a folder with other files and over a previous dst.

    Returns the message of the first failure.
    """
    src = pathlib.Path(src)
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(exist_ok=True)
    (out_dir / "other.malinn").write_bytes(b"another model\n")
    (out_dir / "notes.txt").write_text("keep me\n")
    messages = []
    for dst_name, previous in (("fresh.malinn", None), ("previous.malinn", PREVIOUS)):
        dst = out_dir / dst_name
        if previous is not None:
            dst.write_bytes(previous)
        before = snapshot(out_dir)
        with pytest.raises(ConversionError) as info:
            malinn.convert(src, dst)
        assert isinstance(info.value, ValueError) and isinstance(info.value, malinn.MalinnError)
        message = str(info.value)
        messages.append(message)
        assert src.name in message, f"the message does not name {src.name}: {message}"
        for fragment in fragments:
            assert fragment in message, f"{fragment!r} is not in: {message}"
        if any_of:
            assert any(f in message.lower() for f in any_of), f"none of {any_of} in: {message}"
        assert snapshot(out_dir) == before, "the folder changed (a file written, left or destroyed)"
        if previous is None:
            assert not dst.exists()
        else:
            assert dst.read_bytes() == previous
        assert not [p for p in out_dir.iterdir() if p.name not in before]
    return messages[0]


def truncate(src, dst, fraction):
    data = pathlib.Path(src).read_bytes()
    pathlib.Path(dst).write_bytes(data[: int(len(data) * fraction)])
    return pathlib.Path(dst)


def rewrite_zip(src, dst, drop=(), replace=None):
    replace = replace or {}
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            if name not in drop:
                zout.writestr(name, replace.get(name, zin.read(name)))
    return pathlib.Path(dst)


def reshape_dataset(h5file, path, shape):
    with h5py.File(h5file, "r+") as f:
        del f[path]
        f.create_dataset(path, data=np.ones(shape, dtype=np.float32))


def h5_kernel_path(h5file, layer):
    with h5py.File(h5file, "r") as f:
        group = f[f"model_weights/{layer}"]
        names = [n.decode() if isinstance(n, bytes) else n for n in group.attrs["weight_names"]]
    return f"model_weights/{layer}/" + next(n for n in names if "kernel" in n)


@pytest.fixture
def out_dir(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


# ---------------------------------------------------------------------------------------------
# files that are not models (no Keras needed)


@pytest.mark.parametrize("name", ["empty.keras", "empty.h5", "empty.malinn"])
def test_empty_file(tmp_path, out_dir, name):
    src = tmp_path / name
    src.write_bytes(b"")
    assert_convert_fails(src, out_dir, "empty")


@pytest.mark.parametrize("name", ["random.keras", "random.h5", "random.malinn"])
def test_random_bytes(tmp_path, out_dir, name):
    src = tmp_path / name
    src.write_bytes(np.random.default_rng(5).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    assert_convert_fails(src, out_dir, "not a Keras model file")


def test_missing_source(tmp_path, out_dir):
    assert_convert_fails(tmp_path / "nowhere.keras", out_dir, "no such file")


def test_plain_hdf5_is_not_a_model(tmp_path, out_dir):
    src = tmp_path / "data.h5"
    with h5py.File(src, "w") as f:
        f["x"] = np.arange(3.0)
    assert_convert_fails(src, out_dir, "not a Keras model file")


def test_zip_that_is_not_a_keras_archive(tmp_path, out_dir):
    src = tmp_path / "photos.keras"
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("cat.jpg", b"\xff\xd8\xff")
    assert_convert_fails(src, out_dir, "config.json")


# ---------------------------------------------------------------------------------------------
# damaged Keras files (from the zoo)


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("fmt", FORMAT_PARAMS)
def test_truncated(keras_zoo, tmp_path, out_dir, fmt, fraction):
    good = keras_zoo.path(fmt, "batchnorm")
    src = truncate(good, tmp_path / f"cut{good.suffix}", fraction)
    assert_convert_fails(src, out_dir, any_of=("truncated", "corrupt", "cannot read", "damaged", "not a readable"))


@pytest.mark.parametrize("fmt", ZIP_FORMATS)
def test_zip_missing_weights(keras_zoo, tmp_path, out_dir, fmt):
    src = rewrite_zip(keras_zoo.path(fmt, "batchnorm"), tmp_path / "noweights.keras", drop={"model.weights.h5"})
    assert_convert_fails(src, out_dir, "model.weights.h5")


@pytest.mark.parametrize("fmt", ZIP_FORMATS)
def test_zip_missing_config(keras_zoo, tmp_path, out_dir, fmt):
    src = rewrite_zip(keras_zoo.path(fmt, "batchnorm"), tmp_path / "noconfig.keras", drop={"config.json"})
    assert_convert_fails(src, out_dir, "config.json")


@pytest.mark.parametrize("fmt", ZIP_FORMATS)
def test_zip_config_not_json(keras_zoo, tmp_path, out_dir, fmt):
    src = rewrite_zip(
        keras_zoo.path(fmt, "batchnorm"),
        tmp_path / "badjson.keras",
        replace={"config.json": b'{"class_name": "Sequential", '},
    )
    assert_convert_fails(src, out_dir, "config.json", "JSON")


@pytest.mark.parametrize("fmt", ZIP_FORMATS)
def test_zip_kernel_inconsistent_with_config(keras_zoo, tmp_path, out_dir, fmt):
    """The batchnorm model's Dense 'd_lin' (units=13) gets a (7, 12) kernel."""
    good = keras_zoo.path(fmt, "batchnorm")
    inner = tmp_path / "weights.h5"
    with zipfile.ZipFile(good) as z:
        inner.write_bytes(z.read("model.weights.h5"))
    reshape_dataset(inner, "layers/dense/vars/0", (7, 12))
    src = rewrite_zip(good, tmp_path / "reshaped.keras", replace={"model.weights.h5": inner.read_bytes()})
    assert_convert_fails(src, out_dir, "'d_lin'", "units=13")


@pytest.mark.parametrize("fmt", H5_FORMATS)
def test_h5_kernel_inconsistent_with_config(keras_zoo, tmp_path, out_dir, fmt):
    src = tmp_path / "reshaped.h5"
    src.write_bytes(keras_zoo.path(fmt, "batchnorm").read_bytes())
    reshape_dataset(src, h5_kernel_path(src, "d_tanh"), (13, 4))
    assert_convert_fails(src, out_dir, "'d_tanh'", "units=13")


@pytest.mark.parametrize("fmt", H5_FORMATS)
def test_h5_kernel_does_not_chain(keras_zoo, tmp_path, out_dir, fmt):
    """A kernel with the right units but the wrong number of input features."""
    src = tmp_path / "chain.h5"
    src.write_bytes(keras_zoo.path(fmt, "batchnorm").read_bytes())
    reshape_dataset(src, h5_kernel_path(src, "d_tanh"), (5, 13))
    assert_convert_fails(src, out_dir, "'d_tanh'", "5")


@pytest.mark.parametrize("fmt", H5_FORMATS)
def test_h5_batchnorm_weight_missing(keras_zoo, tmp_path, out_dir, fmt):
    src = tmp_path / "bn.h5"
    src.write_bytes(keras_zoo.path(fmt, "batchnorm").read_bytes())
    with h5py.File(src, "r+") as f:
        group = f["model_weights/bn_folded"]
        names = [n.decode() if isinstance(n, bytes) else n for n in group.attrs["weight_names"]]
        group.attrs["weight_names"] = [n.encode() for n in names[:-1]]
    assert_convert_fails(src, out_dir, "'bn_folded'")


@pytest.mark.parametrize("fmt", H5_FORMATS)
def test_h5_weights_only(keras_zoo, out_dir, fmt):
    assert_convert_fails(keras_zoo.path(fmt, "weights_only"), out_dir, "weights only")


@pytest.mark.parametrize("fmt", FORMAT_PARAMS)
def test_branching_functional_model_converts(keras_zoo, out_dir, fmt):
    """A graph that branches and merges (once refused) converts, and the file predicts what the
    Keras weights compute."""
    dst = malinn.convert(keras_zoo.path(fmt, "branch"), pathlib.Path(out_dir) / "branch.malinn")
    model = malinn.load_model(dst)
    assert type(model).__name__ == "Functional" and model.input_names == ["bx"]
    (left_k, left_b), (right_k, right_b), _ = keras_zoo.weights(fmt, "branch")
    x = np.random.default_rng(0).uniform(-1, 1, (7, 5)).astype(np.float32)
    want = (x @ left_k + left_b) + (x @ right_k + right_b)
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# unsupported layers: all of them in one message


@pytest.mark.parametrize("fmt", ["keras3-zip", "keras3-h5"])
def test_an_operator_with_a_constant_operand_converts_beside_a_masking_layer(keras_zoo, fmt):
    """``x * 2.0`` converts (tests/layers/test_operators.py), and the Masking layer beside it."""
    model = malinn.load_model(keras_zoo.path(fmt, "constant_operand"))
    kernel, bias = next(layer for layer in model.layers if type(layer).__name__ == "Dense").get_weights()
    x = np.random.default_rng(1).uniform(-1, 1, (4, 3)).astype(np.float32)
    x[2] = 0
    doubled, masked = model.predict(x, verbose=0)
    np.testing.assert_allclose(doubled, (x @ kernel + bias) * 2.0, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(masked, x * (x != 0).any(-1, keepdims=True))


@pytest.mark.parametrize("fmt", ["keras3-zip", "keras3-h5"])
def test_an_input_shape_not_fully_known_is_refused(keras_zoo, out_dir, fmt):
    assert_convert_fails(
        keras_zoo.path(fmt, "unknown_shape"),
        out_dir,
        "input shape (None, None, 4) is not fully known",
        "every axis but the batch",
    )


@pytest.mark.parametrize("fmt", ["keras3-zip", "keras3-h5"])
def test_zero_padding1d_channels_first_is_refused(keras_zoo, out_dir, fmt):
    """Padding the steps of a channels-first sequence, run as channels last, pads its channels."""
    assert_convert_fails(
        keras_zoo.path(fmt, "zero_padding1d_channels_first"),
        out_dir,
        "'zp_cf' (ZeroPadding1D)",
        "only data_format='channels_last' runs, got 'channels_first'",
    )


#: Keras arguments that change nothing at inference (or name the layer)
TRAINING_ONLY = ("_initializer", "_regularizer", "_constraint")


def test_window_layers_pass_on_every_argument_keras_takes(keras_zoo):
    """Each Keras 3 window layer's config keys that change what it computes reach the malinn layer,
    which runs them or refuses them by name (a key left out is dropped silently: a channels-first
    ZeroPadding1D ran as channels last)."""
    from malinn.registry import lookup, names

    # the layers converted by passing their Keras config keys on, with the keys each declares
    # (a Keras class a layer refuses by name, Conv3D beside Conv2DTranspose, passes nothing on)
    window_layers = {
        name: lookup("keras", name).keras_config_keys
        for name in names("keras")
        if lookup("keras", name).keras_config_keys and name not in getattr(lookup("keras", name), "keras_refused", {})
    }
    arguments = keras_zoo.manifest.get("keras3_layer_arguments")
    if arguments is None:
        pytest.skip("the zoo has no Keras 3")
    assert set(arguments) == set(window_layers)
    for name, keras_args in arguments.items():
        wanted = {a for a in keras_args if a not in ("name", "kwargs") and not a.endswith(TRAINING_ONLY)}
        assert wanted <= set(window_layers[name]), f"{name}: {sorted(wanted - set(window_layers[name]))} not passed on"


UNSUPPORTED = [("ConvLSTM1D", "bad_conv"), ("RNN", "bad_lstm")]
SUPPORTED = [
    "Masking",
    "Dense",
    "Activation",
    "Dropout",
    "Flatten",
    "BatchNormalization",
    "ReLU",
    "LeakyReLU",
    "ELU",
    "Softmax",
    "Conv2D",
    "MaxPooling2D",
    "GlobalAveragePooling1D",
    "UpSampling2D",
]


@pytest.mark.parametrize("fmt", FORMAT_PARAMS)
def test_every_unsupported_layer_in_one_message(keras_zoo, out_dir, fmt):
    src = keras_zoo.path(fmt, "unsupported")
    classes = [layer["class_name"] for layer in keras_zoo.require(fmt, "unsupported")["layers"]]
    assert classes == ["Dense", "Masking", "Reshape", "ConvLSTM1D", "RNN", "Dense", "Activation"]
    check_unsupported_message(assert_convert_fails(src, out_dir))
    with pytest.raises(ConversionError) as info:  # load_model gives the same error
        malinn.load_model(src)
    assert src.name in str(info.value)
    check_unsupported_message(str(info.value))


def check_unsupported_message(message):
    for cls, name in UNSUPPORTED:
        assert cls in message and name in message, f"{cls} {name!r} not listed: {message}"
    assert "bad_logsm" in message and "log_softmax" in message, message
    for cls in SUPPORTED:
        assert cls in message, f"supported layer {cls} not listed: {message}"


# ---------------------------------------------------------------------------------------------
# destinations


def test_destination_folder_missing(keras_zoo, tmp_path):
    dst = tmp_path / "no" / "such" / "folder" / "m.malinn"
    with pytest.raises(ConversionError) as info:
        malinn.convert(keras_zoo.path("keras3-zip", "noops"), dst)
    message = str(info.value)
    assert "m.malinn" in message and any(w in message.lower() for w in ("folder", "director", "exist")), message
    assert not (tmp_path / "no").exists()


def test_destination_is_a_directory(keras_zoo, tmp_path):
    dst = tmp_path / "model.malinn"
    dst.mkdir()
    (dst / "inside.txt").write_text("keep\n")
    with pytest.raises(ConversionError) as info:
        malinn.convert(keras_zoo.path("keras3-zip", "noops"), dst)
    assert "model.malinn" in str(info.value)
    assert dst.is_dir() and sorted(os.listdir(dst)) == ["inside.txt"]
    assert sorted(os.listdir(tmp_path)) == ["model.malinn"]


def test_failure_while_writing_leaves_nothing(keras_zoo, tmp_path, monkeypatch):
    """A disk that fills up half way: no partial file, the previous one intact."""
    src = keras_zoo.path("keras3-zip", "batchnorm")
    dst = tmp_path / "m.malinn"
    dst.write_bytes(PREVIOUS)
    calls = []
    original = h5py.Group.create_dataset

    def full_disk(self, *args, **kwargs):
        calls.append(args[:1])
        if len(calls) > 1:  # the file exists and holds a first dataset by now
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(h5py.Group, "create_dataset", full_disk)
    with pytest.raises(ConversionError) as info:
        malinn.convert(src, dst)
    monkeypatch.undo()
    assert len(calls) > 1, "the writer never reached its second dataset"
    assert "m.malinn" in str(info.value) and "space" in str(info.value), str(info.value)
    assert dst.read_bytes() == PREVIOUS
    assert sorted(os.listdir(tmp_path)) == ["m.malinn"]
    # and the same conversion works once the disk has room again
    assert malinn.convert(src, dst) == dst and h5py.is_hdf5(dst)


# ---------------------------------------------------------------------------------------------
# damaged malinn model files given to load_model


@pytest.fixture
def good_malinn(keras_zoo, tmp_path):
    path = tmp_path / "good.malinn"
    malinn.convert(keras_zoo.path("keras3-zip", "batchnorm"), path)
    assert isinstance(malinn.load_model(path), malinn.Sequential)
    return path


def assert_load_fails(path, *fragments):
    with pytest.raises(ConversionError) as info:
        malinn.load_model(path)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert pathlib.Path(path).name in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.mark.parametrize("fraction", [0.05, 0.5, 0.95])
def test_truncated_malinn_file(good_malinn, tmp_path, fraction):
    assert_load_fails(truncate(good_malinn, tmp_path / "cut.malinn", fraction))


def test_garbage_malinn_file(tmp_path):
    path = tmp_path / "garbage.malinn"
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + np.random.default_rng(1).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    assert_load_fails(path)
    path.write_bytes(b"")
    assert_load_fails(path, "empty")


def test_malinn_file_with_damaged_config(good_malinn):
    with h5py.File(good_malinn, "r+") as f:
        f.attrs["config"] = '{"layers": ['
    assert_load_fails(good_malinn)


def test_malinn_file_missing_weights(good_malinn):
    with h5py.File(good_malinn, "r+") as f:
        del f["layers"]
    assert_load_fails(good_malinn)


def test_malinn_file_from_a_newer_malinn(good_malinn):
    with h5py.File(good_malinn, "r+") as f:
        f.attrs["format_version"] = 99
    assert_load_fails(good_malinn, "99")


def test_batchnorm_over_several_axes_is_refused_by_name():
    """tf_keras takes BatchNormalization(axis=[1, 3]) (a statistic per pair of indices); the refusal
    said only that its weights 'must be vectors of one length'."""
    from converters.model_spec import KerasLayer, KerasModel
    from converters.validate import check_model

    stats = [np.ones((1, 3, 1, 5), np.float32)] * 4
    layer = KerasLayer(class_name="BatchNormalization", name="bn", config={"axis": [1, 3]}, weights=stats)
    model = KerasModel(
        source="m.h5", format="keras2-h5", keras_version="2.15", input_shape=(None, 3, 4, 5), layers=[layer]
    )
    with pytest.raises(
        ConversionError,
        match=r"^m\.h5: layer 'bn' \(BatchNormalization\): BatchNormalization over "
        r"several axes \(axis=\[1, 3\]\) is not supported",
    ):
        check_model(model)


@pytest.mark.parametrize("fmt", ["keras3-zip", "keras3-h5"])
def test_an_operation_before_a_layer_of_its_class_reads_the_layers_weights(keras_zoo, device, fmt):
    """Keras numbers the weight groups of a model's layers alone: ``d1 + d2`` before a
    ``layers.Add`` leaves the layer's group ``add``, which malinn looked up as ``add_1`` and refused
    ("the weights do not match"; MobileNetV3's .keras files hid their real refusal behind it)."""
    model = malinn.load_model(keras_zoo.path(fmt, "operation_before_layer"))
    data = keras_zoo.data(fmt, "operation_before_layer")
    got, want = model.predict(data["x"]), data["y"]
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max())), fmt


def test_a_tf_keras_operation_layer_reads_its_one_flat_reference(keras_zoo, device):
    """tf_keras saves a TFOpLambda's node as one flat reference: it was read as a call of no inputs
    and convert failed with "unexpected IndexError"; ``h * 2.0`` now computes its constant."""
    model = malinn.load_model(keras_zoo.path("keras2-h5", "tf_op_lambda"))
    k1, b1 = next(layer for layer in model.layers if layer.name == "t_dense").get_weights()
    k2, b2 = next(layer for layer in model.layers if layer.name == "t_out").get_weights()
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    want = ((x @ k1 + b1) * 2.0) @ k2 + b2
    np.testing.assert_allclose(model.predict(x), want, rtol=1e-5, atol=1e-5)
