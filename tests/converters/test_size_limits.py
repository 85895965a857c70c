"""Declared sizes are checked before reading: no zip bomb, no phantom dataset.

A ``.keras`` member that declares far more than the config's layers can hold, or that expands
more than model weights compress, is refused before it is read, naming the member and its
declared size; an HDF5 weight dataset that declares more than the file stores for it, or more than
the config's layers hold, is refused before it is read. The weights member is never held in memory
whole: read in place when stored (as Keras writes it), decompressed into a temporary file
otherwise. The files are made here with zipfile and h5py, small and quick.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from keras_files import dense, dense_weights, keras_object, sequential, weights_h5, write_keras

import malinn
from malinn import ConversionError
from malinn.converters import read_keras
from malinn.converters.limits import MAX_COMPRESSION_RATIO

WIDTHS = (4, 3, 2)
MiB = 1 << 20


def small_config():
    return sequential([dense("d0", 3, "relu", in_width=4), dense("d1", 2, in_width=3)], width=4)


def write_zeros_member(path, config, size, member="model.weights.h5"):
    """A deflated archive whose ``member`` is ``size`` zero bytes (a few KiB compressed)."""
    chunk = bytes(MiB)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("metadata.json", json.dumps({"keras_version": "3.15.1"}))
        if member != "config.json":
            z.writestr("config.json", json.dumps(config))
        with z.open(member, "w", force_zip64=size > 2**31) as out:
            for _ in range(size // MiB):
                out.write(chunk)
        if member != "model.weights.h5":
            z.writestr("model.weights.h5", weights_h5(["Dense", "Dense"], dense_weights(WIDTHS)))
    return path


def declare_size(path, member, size):
    """Rewrite the uncompressed size ``member`` declares (local header and central directory)."""
    data = bytearray(path.read_bytes())
    name = member.encode()
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = 0
        while (at := data.find(signature, at)) >= 0:
            name_at = at + (30 if signature == b"PK\x03\x04" else 46)
            if data[name_at : name_at + len(name)] == name:
                struct.pack_into("<L", data, at + offset, size)
            at += 4
    path.write_bytes(bytes(data))
    return path


def refused(path, *fragments):
    with pytest.raises(ConversionError) as info:
        read_keras(path)
    message = str(info.value)
    assert path.name in message and "refused before reading" in message, message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} is not in: {message}"
    return message


# ---------------------------------------------------------------------------------------------
# zip members


def test_weights_member_larger_than_the_config_allows(tmp_path):
    """Before: the 64 MiB member was read into memory whole, then failed as 'not HDF5'."""
    src = write_zeros_member(tmp_path / "bomb.keras", small_config(), 64 * MiB)
    refused(src, "model.weights.h5 declares 64.0 MiB (67108864 bytes)", "more than what the config's layers can hold")


def test_gigabytes_declared_by_a_small_file(tmp_path):
    """The 3 GiB of the report, declared by a file of a few kilobytes."""
    src = declare_size(
        write_keras(tmp_path / "liar.keras", small_config(), dense_weights(WIDTHS), compression=zipfile.ZIP_DEFLATED),
        "model.weights.h5",
        3 << 30,
    )
    assert src.stat().st_size < 64 * 1024
    refused(src, "model.weights.h5 declares 3.0 GiB (3221225472 bytes)")


def test_compression_ratio_when_the_config_sets_no_bound(tmp_path):
    """A layer malinn cannot bound (Conv1D) leaves the fixed limit; the ratio still refuses."""
    config = small_config()
    config["config"]["layers"].insert(1, keras_object("keras.layers", "Conv1D", {"name": "conv", "filters": 2}))
    src = write_zeros_member(tmp_path / "ratio.keras", config, 32 * MiB)
    refused(src, "model.weights.h5 declares 32.0 MiB", f"more than the {MAX_COMPRESSION_RATIO}:1")


def test_json_member_over_the_limit(tmp_path):
    src = declare_size(
        write_keras(tmp_path / "json.keras", small_config(), dense_weights(WIDTHS), compression=zipfile.ZIP_DEFLATED),
        "config.json",
        1 << 30,
    )
    refused(src, "config.json declares 1.0 GiB", "malinn's limit for a JSON member")


def test_bomb_is_refused_in_small_memory(tmp_path):
    """Peak memory of a process converting a 256 MiB bomb stays near that of importing malinn."""
    src = write_zeros_member(tmp_path / "big.keras", small_config(), 256 * MiB)
    script = (
        "import resource, sys, malinn\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n    malinn.convert(sys.argv[1], sys.argv[2])\nexcept malinn.ConversionError as exc:\n"
        "    print('refused', exc, file=sys.stderr)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run(
        [sys.executable, "-c", script, str(src), str(tmp_path / "big.malinn")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "refused" in proc.stderr and "declares 256.0 MiB" in proc.stderr, proc.stderr
    grown_kib = int(proc.stdout.split()[-1])
    assert grown_kib < 32 * 1024, f"peak memory grew by {grown_kib} KiB"


def test_deflated_archive_reads_like_the_stored_one(keras_zoo, tmp_path, device):
    """Another tool's re-zip (deflated members) is read through a temporary file, to the same model."""
    original = keras_zoo.path("keras3-zip", "digits")
    src = tmp_path / "deflated.keras"
    with zipfile.ZipFile(original) as zin, zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as zout:
        for name in zin.namelist():
            zout.writestr(name, zin.read(name))
    with zipfile.ZipFile(src) as z:
        assert z.getinfo("model.weights.h5").compress_type == zipfile.ZIP_DEFLATED
    a, b = read_keras(original), read_keras(src)
    for la, lb in zip(a.layers, b.layers):
        for wa, wb in zip(la.weights, lb.weights):
            np.testing.assert_array_equal(wa, wb)
    x = keras_zoo.data("keras3-zip", "digits")["x"]
    np.testing.assert_array_equal(malinn.load_model(src).predict(x), malinn.load_model(original).predict(x))


def test_stored_weights_are_checked_against_their_crc(keras_zoo, tmp_path):
    """Read in place, the member still gets zipfile's CRC check: a flipped weight is not used."""
    src = shutil.copy(keras_zoo.path("keras3-zip", "digits"), tmp_path / "flipped.keras")
    with zipfile.ZipFile(src) as z:
        member = z.read("model.weights.h5")
    with h5py.File(io.BytesIO(member), "r") as f:
        offset = f["layers/dense/vars/0"].id.get_offset()
    data = bytearray(src.read_bytes())
    at = data.find(member[offset : offset + 64])
    assert data.count(member[offset : offset + 64]) == 1
    data[at + 5] ^= 0x40
    src.write_bytes(bytes(data))
    with pytest.raises(ConversionError, match=r"model.weights.h5 in the archive is damaged: CRC-32"):
        read_keras(src)


# ---------------------------------------------------------------------------------------------
# HDF5 datasets


H5_FORMATS = [pytest.param("keras3-h5", id="keras3"), pytest.param("keras2-h5", id="tf_keras")]


def replace_kernel(src, dst, **dataset):
    """A copy of the zoo's ``tiny`` .h5 whose first kernel is ``create_dataset(**dataset)``."""
    dst = shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        group = f["model_weights/d13"]
        names = [n.decode() if isinstance(n, bytes) else n for n in group.attrs["weight_names"]]
        kernel = next(n for n in names if "kernel" in n)
        del group[kernel]
        group.create_dataset(kernel, **dataset)
    return dst


@pytest.mark.parametrize("fmt", H5_FORMATS)
def test_h5_dataset_declaring_more_than_it_stores(keras_zoo, tmp_path, fmt):
    """Before: reading it allocated 37 GiB of fill values."""
    src = replace_kernel(
        keras_zoo.path(fmt, "tiny"), tmp_path / "phantom.h5", shape=(100_000, 100_000), dtype="float32"
    )
    refused(src, "declares shape (100000, 100000) of float32 (37.3 GiB", "stores 0 bytes of it")


@pytest.mark.parametrize("fmt", H5_FORMATS)
def test_h5_dataset_larger_than_the_config(keras_zoo, tmp_path, fmt):
    """Real data, but far more than a Dense 3 -> 13 holds: refused before reading it."""
    src = replace_kernel(
        keras_zoo.path(fmt, "tiny"), tmp_path / "big_kernel.h5", data=np.ones((2000, 1000), np.float32)
    )
    refused(src, "declares shape (2000, 1000) of float32 (7.6 MiB", "more than what the config's layers hold")


def test_external_dataset_is_not_followed(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(12, dtype=np.float32).tobytes())
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        weights = dense_weights(WIDTHS)
        for path, arrays in (("dense", weights[0]), ("dense_1", weights[1])):
            for i, array in enumerate(arrays):
                f.create_dataset(f"layers/{path}/vars/{i}", data=array)
        del f["layers/dense/vars/0"]
        f.create_dataset("layers/dense/vars/0", shape=(4, 3), dtype="float32", external=[(str(secret), 0, 48)])
    src = write_keras(tmp_path / "external.keras", small_config(), weights_member=buffer.getvalue())
    with pytest.raises(ConversionError, match="keeps its data in other files"):
        read_keras(src)


def test_a_model_of_thousands_of_layers_is_read_in_linear_time(tmp_path):
    """Each layer's weights were found by recomputing every layer's saving name: 2,000 layers took
    19 s, 10,000 more than two minutes (a file of a few hundred KB)."""
    import time

    from keras_files import keras_object

    count = 4000
    acts = [
        keras_object("keras.layers", "Activation", {"name": f"act_{i}", "activation": "relu"}) for i in range(count)
    ]
    config = sequential([dense("d0", 3, "relu", in_width=4)] + acts, width=4)
    src = write_keras(tmp_path / "deep.keras", config, [dense_weights((4, 3))[0]] + [[] for _ in acts])
    start = time.perf_counter()
    model = read_keras(src)
    seconds = time.perf_counter() - start
    assert len(model.layers) == count + 1
    assert seconds < 30, f"{count} layers read in {seconds:.1f} s"  # quadratic: about 75 s; linear: about 1


@pytest.mark.parametrize("zip_first", [True, False])
def test_a_file_that_is_both_a_zip_and_an_hdf5_file_is_refused(tmp_path, zip_first):
    """malinn read such a file as its .keras zip while tf_keras (malinn verify's reference) loaded it
    as the HDF5 file hidden in it, by its name: a Lambda layer's stored bytecode ran."""
    keras = (Path(__file__).resolve().parents[2] / "examples" / "digits_mlp.keras").read_bytes()
    path = tmp_path / "both.h5"
    with h5py.File(path, "w", userblock_size=512 if zip_first else 0) as f:
        f.attrs["model_config"] = json.dumps({"class_name": "Sequential", "config": {"layers": []}})
    data = bytearray(path.read_bytes())
    if zip_first:
        data[:4] = b"PK\x03\x04"  # the user block's first bytes: a zip reader starts here
    path.write_bytes(bytes(data) + keras)
    with pytest.raises(ConversionError, match="is both a zip archive and an HDF5 file"):
        read_keras(path)


def test_a_fifo_given_as_the_model_is_refused_without_blocking(tmp_path):
    """open() of a FIFO blocks until a writer comes (for good, where none does); an architecture JSON
    read from one had no size limit (its size reads 0)."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    fifo = tmp_path / "model.json"
    os.mkfifo(fifo)
    for weights in (None, tmp_path / "w.h5"):
        with pytest.raises(ConversionError, match="is a FIFO, not a regular file"):
            read_keras(fifo, weights=weights)


def test_an_unzipped_model_whose_member_links_out_of_its_folder_is_refused(tmp_path):
    """A link in an unzipped .keras folder read another file of the machine as the model's."""
    folder = tmp_path / "unzipped"
    with zipfile.ZipFile(Path(__file__).resolve().parents[2] / "examples" / "digits_mlp.keras") as z:
        z.extractall(folder)
    assert read_keras(folder).layers  # the folder as Keras writes it: read
    secret = tmp_path / "secret.json"
    secret.write_text('{"keras_version": "3.15.1"}')
    (folder / "metadata.json").unlink()
    (folder / "metadata.json").symlink_to(secret)
    with pytest.raises(ConversionError, match="metadata.json is a link to .*secret.json, outside the model's folder"):
        read_keras(folder)


def edited_cnn(tmp_path, name: str, edit=None, drop_conv_weights=False):
    """examples/digits_cnn.keras (8 x 8 x 1 -> Conv2D 3 x 3 x 16 -> ... -> Dense 128 x 10) with its
    config.json changed by ``edit(layers)``, or its first convolution's weights taken out."""
    with zipfile.ZipFile(Path(__file__).resolve().parents[2] / "examples" / "digits_cnn.keras") as z:
        members = {n: z.read(n) for n in z.namelist()}
    config = json.loads(members["config.json"])
    if edit is not None:
        edit(config["config"]["layers"])
    members["config.json"] = json.dumps(config).encode()
    if drop_conv_weights:
        buffer = io.BytesIO(members["model.weights.h5"])
        with h5py.File(buffer, "r+") as f:
            for key in list(f["layers/conv2d/vars"]):
                del f["layers/conv2d/vars"][key]
        members["model.weights.h5"] = buffer.getvalue()
    path = tmp_path / f"{name}.keras"
    with zipfile.ZipFile(path, "w") as z:
        for member, data in members.items():
            z.writestr(member, data)
    return path


def _input(size):
    def edit(layers):
        layers[0]["config"]["batch_shape"] = [None, size, size, 1]

    return edit


def _kernel(size, filters=None):
    def edit(layers):
        _input(size)(layers)
        layers[1]["config"]["kernel_size"] = [size, size]
        if filters is not None:
            layers[1]["config"]["filters"] = filters

    return edit


def _filters(count):
    def edit(layers):
        layers[1]["config"]["filters"] = count

    return edit


def test_sizes_a_config_declares_beyond_the_files_weights_are_refused_without_their_memory(tmp_path):
    """A 117 KB .keras whose config declares a 2000 x 2000 input took 3.0 GB and 24.5 s before its
    ConversionError (a Conv2D's kernel_size of 3000 x 3000: 2.6 GB), larger sizes raised numpy's
    _ArrayMemoryError, and a convolution whose weights the file lacks ran with random ones: every
    weight a layer's config and input declare is checked against what the file holds before
    anything of its size is made (the layers are built with placeholders that take no memory)."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc here to read a process's peak memory from")
    cases = {
        "input": (
            _input(2000),
            None,
            r"layer 'dense' \(Dense\): on inputs of shape \(None, 8000000\) its config makes "
            r"weights of shapes \(8000000, 10\), \(10,\), larger than the file's \(128, 10\), "
            r"\(10,\)",
        ),
        "kernel": (
            _kernel(3000),
            None,
            r"layer 'conv2d' \(Conv2D\): on inputs of shape \(None, 3000, 3000, 1\) its "
            r"config makes weights of shapes \(3000, 3000, 1, 16\), \(16,\), larger than "
            r"the file's \(3, 3, 1, 16\), \(16,\)",
        ),
        "filters": (
            _filters(10**9),
            None,
            r"layer 'conv2d' \(Conv2D\): on inputs of shape \(None, 8, 8, 1\) its "
            r"config makes weights of shapes \(3, 3, 1, 1000000000\), \(1000000000,\)",
        ),
        "impossible": (
            _kernel(10**6, 10**9),
            None,
            r"layer 'conv2d' \(Conv2D\): a weight of shape \(1000000, 1000000, "
            r"1, 1000000000\) has more values than an array can hold",
        ),
        "no_weights": (
            None,
            True,
            r"layer 'conv2d' \(Conv2D\): the file holds no weights for it; on inputs of shape "
            r"\(None, 8, 8, 1\) its config makes weights of shapes \(3, 3, 1, 16\), \(16,\)",
        ),
    }
    paths = [str(edited_cnn(tmp_path, name, edit, drop)) for name, (edit, drop, _) in cases.items()]
    # the peak of this process's own memory (VmHWM: ru_maxrss would start at the forking worker's)
    script = (
        "import sys, time, malinn\n"
        "for path in sys.argv[1:]:\n"
        "    started = time.perf_counter()\n"
        "    try:\n        malinn.load_model(path)\n        said = 'loaded'\n"
        "    except Exception as e:\n        said = f'{type(e).__name__}: {e}'\n"
        "    print(f'{time.perf_counter() - started:.2f} {said}')\n"
        "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, *paths], capture_output=True, text=True, timeout=300)
    *lines, peak_kib = out.stdout.strip().split("\n")
    assert len(lines) == len(cases), out.stdout + out.stderr
    for line, (name, (_, _, message)) in zip(lines, cases.items()):
        seconds, said = line.split(" ", 1)
        assert said.startswith("ConversionError: "), f"{name}: {said}"
        assert re.search(message, said), f"{name}: {said}"
        assert float(seconds) < 20, f"{name}: {seconds} s"  # a guard against a hang: each takes a tenth of a second
    assert int(peak_kib) < 600 * 1024, f"peak {int(peak_kib) // 1024} MiB"


@pytest.mark.parametrize("axes", [63, 64, 302])
def test_an_input_of_more_axes_than_an_array_can_have_is_refused_naming_the_layer(tmp_path, axes):
    """A 302-axis batch_shape converted, and no batch could ever be given to it (numpy arrays have
    at most 64 axes): refused when it is read, naming the layer that receives it; 63 axes and the
    batch's run."""
    from deep_files import _keras3_weight_tree, keras3_config

    config = keras3_config(1, graph=False)
    config["config"]["layers"][0]["config"]["batch_shape"] = [None] + [1] * (axes - 1) + [4]
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        _keras3_weight_tree(f, 1, False)
    path = tmp_path / f"axes{axes}.keras"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("config.json", json.dumps(config))
        z.writestr("model.weights.h5", buffer.getvalue())
    if axes < 64:
        model = malinn.load_model(path)
        x = np.ones((2,) + (1,) * (axes - 1) + (4,), np.float32)
        assert model.predict(x).shape == (2,) + (1,) * (axes - 1) + (3,)
        return
    with pytest.raises(
        ConversionError,
        match=f"layer 'dense' \\(Dense\\): layer 'dense': input_shape has {axes} axes "
        "besides the batch's; a batch of such samples could never be given "
        r"\(numpy arrays have at most 64 axes, the batch's and 63 more\)",
    ):
        malinn.load_model(path)


def test_a_fifo_in_an_unzipped_model_is_named_as_one(tmp_path):
    """An unzipped .keras folder whose config.json is a FIFO was called "a directory, not a Keras
    model file"; its weights as a FIFO, "missing"."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    for member in ("config.json", "model.weights.h5"):
        folder = tmp_path / member
        with zipfile.ZipFile(Path(__file__).resolve().parents[2] / "examples" / "digits_mlp.keras") as z:
            z.extractall(folder)
        (folder / member).unlink()
        os.mkfifo(folder / member)
        with pytest.raises(
            ConversionError, match=f"{member} is a FIFO, not a regular file; a Keras model's folder holds files"
        ):
            read_keras(folder)


def test_a_keras_archive_whose_stored_weights_begin_on_a_512_byte_boundary_is_read(tmp_path):
    """Keras stores model.weights.h5 uncompressed: where its data begins at a multiple of 512 bytes,
    HDF5 finds its superblock there and takes the archive before it for a user block. The file is
    still the .keras archive Keras saved (its HDF5 view holds the weights, no model)."""
    config = sequential([dense("d0", 3, "relu", in_width=4)], width=4)
    weights = [dense_weights((4, 3))[0]]
    for pad in range(0, 1024):  # a metadata length that puts the weights member's data on a boundary
        path = tmp_path / f"aligned{pad}.keras"
        member = weights_h5(["Dense"], weights)
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
            z.writestr("metadata.json", json.dumps({"keras_version": "3.15.1", "date_saved": "x" * pad}))
            z.writestr("config.json", json.dumps(config))
            z.writestr("model.weights.h5", member)
        if h5py.is_hdf5(path):
            break
    else:
        pytest.fail("no metadata length put the weights on a 512-byte boundary")
    model = read_keras(path)
    assert [layer.class_name for layer in model.layers][-1] == "Dense"
    np.testing.assert_array_equal(model.layers[-1].weights[0], weights[0][0])
