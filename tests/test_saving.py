"""malinn model files: round trips for every target, atomic writes, damaged files."""

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

import malinn
from malinn import ConversionError, Sequential
from malinn.kernel_library import load_library
from malinn.layers import Activation, BatchNormalization, Dense, Flatten, LeakyReLU


def sample_model(rng):
    model = Sequential([Flatten(), Dense(13, activation="gelu"), BatchNormalization(), LeakyReLU(0.1),
                        Dense(3, use_bias=False), Activation("softmax")], name="sample")
    model.build((None, 3, 5))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) + (2 if i == 5 else 0)
                       for i, w in enumerate(model.get_weights())])
    return model


@pytest.mark.parametrize("target", [None, "gpu", "cpu", "accelerator"] + load_library().codenames("matmul"))
def test_save_load_predicts_bit_for_bit(device, target, tmp_path, rng):
    model = sample_model(rng)
    x = rng.standard_normal((7, 3, 5)).astype(np.float32)
    path = model.save(tmp_path / "m.malinn", target=target)
    loaded = malinn.load_model(path)
    assert [type(l).__name__ for l in loaded.layers] == [type(l).__name__ for l in model.layers]
    assert loaded.input_shape == (None, 3, 5)
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))
    with h5py.File(path) as f:
        assert f.attrs["target"] == malinn.saving.resolve_target(target).codename
        assert f.attrs["format_version"] == 1


def test_weights_laid_out_for_the_device_are_uploaded_as_stored(device, tmp_path, rng):
    model = sample_model(rng)
    path = model.save(tmp_path / "m.malinn")            # the current device's kernel
    loaded = malinn.load_model(path)
    dense = loaded.layers[1]
    layout, padded, flat, precision = dense.prepacked
    assert precision == "fp32"
    assert layout == malinn.ops.kernel_for("matmul").matrices["a"].layout
    np.testing.assert_array_equal(flat, layout.pack(dense.kernel.T, padded))


def test_unknown_target_is_refused(tmp_path, rng):
    with pytest.raises(ConversionError, match="unknown target 'tpu'"):
        sample_model(rng).save(tmp_path / "m.malinn", target="tpu")
    assert not (tmp_path / "m.malinn").exists()


def test_failed_write_leaves_nothing_and_keeps_an_old_file(tmp_path, rng, monkeypatch):
    model = sample_model(rng)
    path = tmp_path / "m.malinn"
    path.write_bytes(b"previous contents")

    def broken(self):
        raise OSError("disk full (injected)")

    monkeypatch.setattr(h5py.Group, "create_dataset", lambda *a, **k: broken(None))
    with pytest.raises(ConversionError, match="disk full"):
        model.save(path)
    assert path.read_bytes() == b"previous contents"
    assert os.listdir(tmp_path) == ["m.malinn"]


def test_unbuilt_model_and_missing_folder(tmp_path):
    with pytest.raises(ConversionError, match="not built"):
        Sequential([Dense(2)]).save(tmp_path / "x.malinn")
    model = Sequential([Dense(2)])
    model.build((None, 3))
    with pytest.raises(ConversionError, match="does not exist"):
        model.save(tmp_path / "nowhere" / "x.malinn")


def _damage(path, how):
    with h5py.File(path, "r+") as f:
        if how == "config":
            f.attrs["config"] = "{not json"
        elif how == "newer":
            f.attrs["format_version"] = 99
        elif how == "kernel":
            del f["layers/1/kernel_laid_out"]
        elif how == "class":
            config = json.loads(f.attrs["config"])
            config["layers"][1]["class_name"] = "Conv9D"
            f.attrs["config"] = json.dumps(config)


@pytest.mark.parametrize("how, fragment", [("config", "damaged malinn model file"), ("newer", "newer malinn"),
                                           ("kernel", "damaged malinn model file"), ("class", "unknown layer class 'Conv9D'")])
def test_damaged_model_files_raise_conversion_errors(tmp_path, rng, how, fragment):
    path = sample_model(rng).save(tmp_path / "m.malinn")
    _damage(path, how)
    with pytest.raises(ConversionError, match=fragment) as info:
        malinn.load_model(path)
    assert str(path) in str(info.value)


def test_missing_and_truncated_files(tmp_path, rng):
    with pytest.raises(ConversionError, match="no such file"):
        malinn.load_model(tmp_path / "absent.malinn")
    path = sample_model(rng).save(tmp_path / "m.malinn")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ConversionError):
        malinn.load_model(path)


@pytest.mark.parametrize("path", [None, 3, 2.5])
def test_load_model_names_a_path_that_is_not_one(path):
    with pytest.raises(TypeError, match=f"path must be a file path \\(str, bytes or os.PathLike\\), got "
                                        f"{type(path).__name__}"):
        malinn.load_model(path)


def test_an_empty_path_is_named_not_taken_for_the_current_folder():
    """Path("") is ".": load_model(json, weights="") said ".: is a directory" (a review)."""
    with pytest.raises(ConversionError, match="^weights is an empty path; give the file$"):
        malinn.load_model(Path(__file__).resolve().parents[1] / "examples" / "digits_mlp.keras", weights="")
    with pytest.raises(ConversionError, match="^path is an empty path; give the file$"):
        malinn.load_model(b"")


def test_load_model_takes_a_bytes_path(tmp_path):
    model = malinn.Sequential([malinn.layers.Dense(2)])
    model.build((None, 3))
    path = model.save(tmp_path / "m.malinn")
    np.testing.assert_array_equal(malinn.load_model(bytes(path)).get_weights()[0], model.get_weights()[0])


def test_a_bit_flipped_in_a_files_weights_is_a_damaged_file(tmp_path):
    """A model file's weights carry HDF5's Fletcher-32 checksum: one flipped bit (a board's flash
    going bad) is a damaged file, where it was loaded and predicted with a weight of 1e38."""
    model = Sequential([Dense(8, activation="relu", name="d"), Dense(3, name="e")])
    model.build((None, 5))
    path = model.save(tmp_path / "m.malinn")
    with h5py.File(path, "r") as f:
        data = f["layers/0/kernel_laid_out"]
        assert data.fletcher32 and f["layers/0/bias"].fletcher32
        offset = data.id.get_chunk_info(0).byte_offset
    malinn.load_model(path)   # intact: read
    with open(path, "r+b") as f:
        f.seek(offset + 3)
        byte = f.read(1)
        f.seek(offset + 3)
        f.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(ConversionError, match=r"m.malinn: damaged malinn model file \(OSError: .*filter"):
        malinn.load_model(path)
