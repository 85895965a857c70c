"""malinn model files: round trips for every target, atomic writes, damaged files."""

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

import malinn
from malinn import ConversionError, Sequential
from malinn.layers import Activation, BatchNormalization, Dense, Flatten, LeakyReLU
from malinn.library.kernel_library import load_library


def sample_model(rng):
    model = Sequential(
        [
            Flatten(),
            Dense(13, activation="gelu"),
            BatchNormalization(),
            LeakyReLU(0.1),
            Dense(3, use_bias=False),
            Activation("softmax"),
        ],
        name="sample",
    )
    model.build((None, 3, 5))
    model.set_weights(
        [
            rng.standard_normal(w.shape).astype(np.float32) + (2 if i == 5 else 0)
            for i, w in enumerate(model.get_weights())
        ]
    )
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
        assert f.attrs["target"] == malinn.model.saving.resolve_target(target).codename
        assert f.attrs["format_version"] == 1


def test_weights_laid_out_for_the_device_are_uploaded_as_stored(device, tmp_path, rng):
    model = sample_model(rng)
    path = model.save(tmp_path / "m.malinn")  # the current device's kernel
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


@pytest.mark.parametrize(
    "how, fragment",
    [
        ("config", "damaged malinn model file"),
        ("newer", "newer malinn"),
        ("kernel", "damaged malinn model file"),
        ("class", "unknown layer class 'Conv9D'"),
    ],
)
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
    with pytest.raises(
        TypeError, match=f"path must be a file path \\(str, bytes or os.PathLike\\), got {type(path).__name__}"
    ):
        malinn.load_model(path)


def test_an_empty_path_is_named_not_taken_for_the_current_folder():
    """Path("") is ".": load_model(json, weights="") said ".: is a directory"."""
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
    malinn.load_model(path)  # intact: read
    with open(path, "r+b") as f:
        f.seek(offset + 3)
        byte = f.read(1)
        f.seek(offset + 3)
        f.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(
        ConversionError,
        match=r"m.malinn \(a damaged malinn model file\): cannot read weight layers/0/kernel_laid_out: .*filter",
    ):
        malinn.load_model(path)


# ---------------------------------------------------------------------------------------------
# a hostile model file (a service loading uploads): refused by name, in bounded time and memory


def _hostile(tmp_path, rng, edit):
    path = tmp_path / "m.malinn"
    sample_model(rng).save(path, target="cpu")
    with h5py.File(path, "r+") as f:
        edit(f)
    return path


def _replace(group, name, **dataset):
    del group[name]
    group.create_dataset(name, **dataset)


def test_a_weight_kept_in_another_file_is_refused(tmp_path, rng):
    """HDF5 external storage read /etc/passwd into a bias (and convert copied it on)."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n" * 4)
    path = _hostile(
        tmp_path,
        rng,
        lambda f: _replace(
            f["layers/1"], "bias", shape=(13,), dtype="u1", external=[(str(secret), 0, h5py.h5f.UNLIMITED)]
        ),
    )
    with pytest.raises(ConversionError, match="layers/1/bias keeps its data in other files"):
        malinn.load_model(path)


def test_an_external_link_is_refused_in_every_hdf5_model_file(tmp_path, rng):
    """A link into another HDF5 file (another user's model; a FIFO, which hung the read for good)."""
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["bias"] = np.ones(20, np.float32)

    def link(f):
        del f["layers/1/bias"]
        f["layers/1/bias"] = h5py.ExternalLink(str(other), "/bias")

    with pytest.raises(ConversionError, match="layers/1/bias is an external link into another file"):
        malinn.load_model(_hostile(tmp_path, rng, link))
    keras_h5 = tmp_path / "k.h5"  # a Keras .h5 file's weights, the same way
    with h5py.File(keras_h5, "w") as f:
        f.attrs["model_config"] = json.dumps({"class_name": "Sequential", "config": {"layers": []}})
        f.create_group("model_weights")["d"] = h5py.ExternalLink(str(other), "/")
    with pytest.raises(ConversionError, match="model_weights/d is an external link"):
        malinn.load_model(keras_h5)


def test_a_weight_declaring_more_than_the_file_stores_is_refused_before_reading(tmp_path, rng):
    """A 75 KB file declaring a 4 GiB bias took 4.2 GB of memory and 24 s before its shape failed."""
    path = _hostile(
        tmp_path,
        rng,
        lambda f: _replace(f["layers/1"], "bias", shape=(1 << 30,), dtype="f4", chunks=(1 << 20,), compression="gzip"),
    )
    with pytest.raises(ConversionError, match=r"layers/1/bias declares shape \(1073741824,\) .* but the file stores"):
        malinn.load_model(path)


@pytest.mark.parametrize(
    "edit, fragment",
    [
        (lambda f: f.attrs.__setitem__("config", json.dumps({"pad": "x" * (17 << 20)})), "attribute holds"),
        (lambda f: f.attrs.__setitem__("format_version", -5), "format version -5 is no malinn format"),
        (lambda f: f.attrs.__delitem__("format_version"), "has no format version"),
        (
            lambda f: f.attrs.__setitem__("config", json.dumps({"class_name": "Sequential"})),
            "its config lists no layers",
        ),
        (
            lambda f: _replace(f["layers/1"], "bias", data=np.ones(13, np.complex64)),
            "layers/1/bias has dtype complex64",
        ),
        # 65,536 chunks of one float: HDF5's bookkeeping of 2**24 such chunks took 19 GB
        (
            lambda f: _replace(f["layers/1"], "bias", data=np.ones(1 << 16, np.float32), chunks=(1,)),
            "layers/1/bias is stored in 65536 chunks",
        ),
    ],
)
def test_a_tampered_file_is_refused_by_name(tmp_path, rng, edit, fragment):
    with pytest.raises(ConversionError, match=fragment):
        malinn.load_model(_hostile(tmp_path, rng, edit))


def test_a_source_named_in_bytes_that_are_not_utf8_round_trips(tmp_path):
    """Converting b'model\\xff.keras' exited 0, and every later load of the file failed ("damaged
    malinn model file (UnicodeEncodeError ... '\\udcff')"): the source's name, which the file
    records, is kept as the bytes it is, and a recorded text that is not valid Unicode never makes
    a model unloadable."""
    import shutil
    import subprocess
    import sys

    folder = os.fsencode(tmp_path)
    src, dst = os.path.join(folder, b"model\xff.keras"), os.path.join(folder, b"out\xfe.malinn")
    try:
        shutil.copyfile(Path(__file__).resolve().parents[1] / "examples" / "digits_mlp.keras", src)
    except OSError:
        pytest.skip("this file system takes only UTF-8 names")
    out = subprocess.run(
        [sys.executable, "-m", "malinn.cli", "convert", src, "-o", dst, "--target", "cpu"],
        capture_output=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    model = malinn.load_model(dst)
    assert os.fsencode(model.source["file"]) == src and len(model.layers) == 4
    summary = subprocess.run([sys.executable, "-m", "malinn.cli", "summary", dst], capture_output=True, timeout=300)
    assert summary.returncode == 0 and b"Total params: 2778" in summary.stdout, summary.stderr
    again = os.path.join(folder, b"again.malinn")
    malinn.convert(dst, again, target="cpu")  # a malinn file's source passes on to the next
    assert os.fsencode(malinn.load_model(again).source["file"]) == src
    with h5py.File(again, "r+") as f:  # text no file name makes (a lone high surrogate), a source not an object
        f.attrs["source"] = json.dumps({"file": "m\ud800.keras", "format": "keras3-zip", "keras_version": "3"})
    assert malinn.load_model(again).source["file"] == "m\\ud800.keras"
    with h5py.File(again, "r+") as f:
        f.attrs["source"] = json.dumps(["m.keras"])
    assert malinn.load_model(again).source is None


def test_a_config_declaring_more_than_the_weights_costs_no_memory(tmp_path):
    """Loading builds the layers before the file's weights replace their zeros: an input shape edited
    to 4000 x 4000 made a Dense kernel of 1.3 GB (copied, so touched) before its shape was refused."""
    import subprocess
    import sys

    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc here to read a process's peak memory from")
    path = tmp_path / "cnn.malinn"
    malinn.convert(Path(__file__).resolve().parents[1] / "examples" / "digits_cnn.keras", path, target="cpu")
    with h5py.File(path, "r+") as f:
        config = json.loads(f.attrs["config"])
        config["input_shape"] = [4000, 4000, 1]
        f.attrs["config"] = json.dumps(config)
    # the peak of this process's own memory (VmHWM: ru_maxrss would start at the forking worker's)
    script = (
        "import sys, malinn\ntry:\n    malinn.load_model(sys.argv[1])\nexcept malinn.ConversionError as e:\n"
        "    print(e)\nprint(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=300)
    message, peak_kib = out.stdout.rsplit("\n", 2)[:2]
    assert "kernel shape (128, 10) does not match (32000000, 10)" in message, out.stdout + out.stderr
    assert int(peak_kib) < 600 * 1024, f"peak {int(peak_kib) // 1024} MiB"


def test_int8_scales_of_another_count_than_the_kernels_rows_are_refused(tmp_path, rng):
    """One scale for a kernel of 13 rows was broadcast over them, unnoticed."""
    path = tmp_path / "m8.malinn"
    model = sample_model(rng)
    model.precision = "int8-weights"
    model.save(path, target="cpu")
    with h5py.File(path, "r+") as f:
        _replace(f["layers/1"], "kernel_scales", data=np.ones(1, np.float32))
    with pytest.raises(ConversionError, match="1 int8 scales for a kernel of 13 rows"):
        malinn.load_model(path)
