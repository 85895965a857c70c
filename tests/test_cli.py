"""The malinn command: convert, predict, verify, summary, tune, devices; help, exit codes, clean errors."""

import importlib.util
import io
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import malinn as malinn_api  # the module (malinn() below runs its command line)
from malinn.version import __version__

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits_mlp.keras"


HAS_TF = importlib.util.find_spec("tensorflow") is not None


def malinn(*args, cwd=None, env=None, text=True):
    return subprocess.run(
        [sys.executable, "-m", "malinn.cli", *map(str, args)],
        capture_output=True,
        text=text,
        cwd=cwd,
        timeout=300,
        env=None if env is None else {**os.environ, **env},
    )


@pytest.fixture(scope="module")
def digits_malinn(tmp_path_factory):
    path = tmp_path_factory.mktemp("digits") / "digits.malinn"
    import malinn as m

    m.convert(DIGITS, path, target="gpu")
    return path


@pytest.mark.parametrize("command", ["convert", "predict", "verify", "summary", "tune", "warm", "devices"])
def test_every_command_has_help(command):
    out = malinn(command, "--help")
    assert out.returncode == 0 and "usage: malinn " + command in out.stdout


def test_python_m_malinn_is_the_malinn_command():
    out = subprocess.run([sys.executable, "-m", "malinn", "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == malinn("--version").stdout and __version__ in out.stdout


def test_usage_errors_exit_2():
    assert malinn().returncode == 2
    assert malinn("bogus").returncode == 2
    assert malinn("convert").returncode == 2  # the source is required


def test_devices_lists_and_marks_the_default():
    out = malinn("devices")
    assert out.returncode == 0 and out.stdout.startswith("* [")


def test_convert_then_predict_matches_keras(tmp_path):
    out = malinn("convert", DIGITS, "-o", tmp_path / "d.malinn")
    assert out.returncode == 0, out.stderr
    assert "weights laid out for" in out.stdout
    data = np.load(ROOT / "examples" / "digits_test.npz")
    np.save(tmp_path / "x.npy", data["x"])
    out = malinn("predict", tmp_path / "d.malinn", tmp_path / "x.npy", "-o", tmp_path / "y.npy", "--batch-size", 50)
    assert out.returncode == 0, out.stderr
    y = np.load(tmp_path / "y.npy")
    assert y.shape == (360, 10) and y.dtype == np.float32
    assert np.abs(y - data["keras"]).max() <= 1e-5
    assert (y.argmax(1) == data["keras"].argmax(1)).all()


@pytest.mark.parametrize("target", ["gpu", "cpu", "morton_4_2"])
def test_convert_target(tmp_path, target):
    out = malinn("convert", DIGITS, "-o", tmp_path / "d.malinn", "--target", target)
    assert out.returncode == 0, out.stderr


def test_errors_are_one_line_without_traceback_and_leave_no_file(tmp_path):
    bad = tmp_path / "bad.keras"
    bad.write_bytes(b"not a model at all")
    out = malinn("convert", bad, "-o", tmp_path / "out.malinn")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("malinn: error: ") and str(bad) in out.stderr
    assert not (tmp_path / "out.malinn").exists()
    out = malinn("convert", DIGITS, "-o", tmp_path / "o.malinn", "--target", "tpu")
    assert out.returncode == 1 and "unknown target 'tpu'" in out.stderr
    np.save(tmp_path / "x.npy", np.zeros((2, 63), np.float32))
    out = malinn("predict", DIGITS, tmp_path / "x.npy", "-o", tmp_path / "y.npy")
    assert out.returncode == 1 and "expected shape (None, 64), found shape (2, 63)" in out.stderr
    assert not (tmp_path / "y.npy").exists()


def test_malinn_never_imports_tensorflow(tmp_path):
    script = (
        "import sys, numpy as np, malinn; m = malinn.load_model(sys.argv[1]); m.predict(np.zeros((1, 64)));"
        "import malinn.cli.commands, malinn.converters.to_malinn;"
        "print(sorted(n for n in sys.modules if n.split('.')[0] in ('tensorflow', 'keras', 'tf_keras')))"
    )
    out = subprocess.run([sys.executable, "-c", script, DIGITS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------ predict: inputs and stdout
def test_predict_the_bundled_npz_to_stdout_gives_a_loadable_npy(digits_malinn):
    data = np.load(ROOT / "examples" / "digits_test.npz")
    out = malinn(
        "predict",
        digits_malinn,
        ROOT / "examples" / "digits_test.npz",
        "--key",
        "x",
        text=False,
        env={"MALINN_PROGRESS": "0"},
    )  # the report alone (no build summary, however slow the builds)
    assert out.returncode == 0, out.stderr
    y = np.load(io.BytesIO(out.stdout), allow_pickle=False)
    assert y.shape == (360, 10) and np.abs(y - data["keras"]).max() <= 1e-5
    assert b"written to stdout" in out.stderr and len(out.stderr.splitlines()) == 1


def test_predict_to_a_full_disk_fails_and_says_so(digits_malinn):
    data = ROOT / "examples" / "digits_test.npz"
    with open("/dev/full", "wb") as full:  # stdout redirected onto a full disk: every write fails
        out = subprocess.run(
            [sys.executable, "-m", "malinn.cli", "predict", str(digits_malinn), str(data), "--key", "x"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    assert out.returncode == 1 and "stdout: cannot write (No space left on device)" in out.stderr
    assert "written to" not in out.stderr


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".csv"])
def test_predict_writes_the_format_its_output_names(digits_malinn, tmp_path, suffix):
    data = np.load(ROOT / "examples" / "digits_test.npz")
    out = malinn(
        "predict", digits_malinn, ROOT / "examples" / "digits_test.npz", "--key", "x", "-o", tmp_path / f"y{suffix}"
    )
    assert out.returncode == 0, out.stderr
    path = tmp_path / f"y{suffix}"
    if suffix == ".npy":
        y = np.load(path, allow_pickle=False)
    elif suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            assert list(z.keys()) == ["dense_2"]
            y = z["dense_2"]
    else:
        y = np.loadtxt(path, delimiter=",", dtype=np.float32)
    assert y.shape == (360, 10) and np.abs(y - data["keras"]).max() <= 1e-5


def test_predict_refuses_an_output_suffix_it_cannot_write_before_any_work(digits_malinn, tmp_path):
    out = malinn("predict", digits_malinn, tmp_path / "missing.npy", "-o", tmp_path / "y.txt")
    assert out.returncode == 2 and "predict writes .npy, .npz or .csv files" in out.stderr
    assert not (tmp_path / "y.txt").exists()


def test_predict_writes_npy_into_a_fifo_whatever_its_suffix(digits_malinn, tmp_path):
    fifo = tmp_path / "predictions.fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "malinn.cli",
            "predict",
            str(digits_malinn),
            str(ROOT / "examples" / "digits_test.npz"),
            "--key",
            "x",
            "-o",
            str(fifo),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    with open(fifo, "rb") as reader:  # opens once the writer does
        y = np.load(io.BytesIO(reader.read()), allow_pickle=False)
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    assert y.shape == (360, 10) and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_verify_names_the_folder_it_cannot_write_the_inputs_to(monkeypatch, capsys):
    """A full TMPDIR: numpy's error named no file ("[Errno 28] No space left on device")."""
    from malinn.cli import commands as cli
    from malinn.cli import verify_command

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(verify_command.np, "savez", full)
    monkeypatch.setenv("MALINN_PROGRESS", "0")  # the error alone (no build summary, however slow the builds)
    assert cli.main(["verify", str(DIGITS), "--input", str(ROOT / "examples" / "digits_test.npz"), "--key", "x"]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("malinn: error: writing the inputs for Keras to ")
        and "x.npz failed (No space left on device); set TMPDIR to a folder with room" in err
    ), err


def test_verify_shows_the_exception_keras_failed_with():
    from malinn.cli.verify_command import exception_line as _exception_line

    keras = (
        'Traceback (most recent call last):\n  File "m.py"\nValueError: Exception encountered when calling '
        'Sequential.call().\n\nInput 0 of layer "dense" is incompatible\n\nArguments received by '
        "Sequential.call():\n  • inputs=x\nException ignored in: <function F.__del__>\nTraceback (most "
        "recent call last):\n  File \"f.py\"\nTypeError: 'NoneType' object is not callable\n"
    )
    assert _exception_line(keras) == (
        'ValueError: Exception encountered when calling Sequential.call(). Input 0 of layer "dense" is incompatible'
    )
    assert _exception_line("Traceback (most recent call last):\n  File \"x\"\nKeyError: 'k'\n") == "KeyError: 'k'"
    assert _exception_line("no traceback here\n") == "no traceback here"


@pytest.mark.skipif(not HAS_TF, reason="verify needs tensorflow (test extra)")
def test_verify_says_keras_quantized_layers_to_int8_and_takes_its_tolerance(keras_zoo):
    """model.quantize("int8"): Keras rounds the layers' inputs to int8 as well, malinn computes in
    float32 with the int8 weights. verify said 'keras in float32' and failed at 1e-5 (5e-3)."""
    out = malinn("verify", keras_zoo.path("keras3-zip", "int8"))
    assert out.returncode == 0, out.stdout + out.stderr
    header = out.stdout.splitlines()[0]
    assert "keras in int8" in header and "keras in float32" not in header, header
    assert "rounding their inputs to int8 too" in out.stdout and "(tolerance 0.05)" in out.stdout.splitlines()[-1]


@pytest.mark.skipif(not HAS_TF, reason="verify needs tensorflow (test extra)")
def test_verify_compares_with_keras_without_onednns_fused_nan_results(tmp_path):
    """TensorFlow's oneDNN softmax gives [nan, 0, 0, 0] for [nan, 0, 1, 2] (Keras's arithmetic, and
    malinn: all NaN); verify ran Keras with oneDNN on and failed with an infinite error."""
    path, x = tmp_path / "softmax.keras", tmp_path / "x.npy"
    np.save(x, np.array([[np.nan, 0, 1, 2], [1, 2, 3, 4]], np.float32))
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import keras; m = keras.Sequential([keras.Input((4,)), keras.layers.Softmax()]); m.save({str(path)!r})",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    out = subprocess.run(
        [sys.executable, "-m", "malinn.cli", "verify", str(path), "--input", str(x)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0 and out.stdout.splitlines()[-1].startswith("OK"), out.stdout + out.stderr


def test_verify_names_a_shape_that_differs_from_keras():
    """A layer whose output has another size than Keras's is a mismatch named with both shapes
    (it was numpy's broadcasting error); the same values in another shape are compared."""
    from malinn.cli.verify_command import compared as _compared

    assert _compared(np.zeros((16, 6, 9), np.float32), np.zeros((16, 3, 12), np.float32)) == (
        "shapes differ: malinn (16, 6, 9), keras (16, 3, 12)",
        np.inf,
    )
    cells, rel = _compared(np.full((16, 54), 0.5, np.float32), np.zeros((16, 6, 9), np.float32))
    assert rel == 0.5 and cells.split() == ["5.000e-01", "5.000e-01"]


def test_verify_counts_a_nan_or_infinity_keras_does_not_have_as_an_infinite_error():
    from malinn.cli.verify_command import argmax_agreement as _argmax_agreement
    from malinn.cli.verify_command import error_sizes as _errors

    keras = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]], np.float32)
    assert _errors(keras + 0.25, keras) == (0.25, 0.125)
    assert _errors(np.array([[np.nan, 0.0], [np.nan, 1.0], [np.nan, 2.0]], np.float32), keras) == (np.inf, np.inf)
    assert _errors(np.array([[np.inf, 0.0], [1, 1], [2, 2]], np.float32), keras) == (np.inf, np.inf)
    both = np.array([[np.nan, -np.inf], [1, 1], [2, 2.5]], np.float32)  # the same NaN and -inf as Keras
    assert _errors(both, np.array([[np.nan, -np.inf], [1, 1], [2, 2]], np.float32)) == (0.5, 0.25)
    assert _argmax_agreement(
        np.array([[np.nan, 0.0], [0.0, 1.0]], np.float32), np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    ).startswith("argmax agreement: 1/2")


def test_predict_prints_a_table_on_a_terminal(digits_malinn, capsys, monkeypatch):
    from malinn.cli.commands import main

    data = np.load(ROOT / "examples" / "digits_test.npz")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["predict", str(digits_malinn), str(ROOT / "examples" / "digits_test.npz"), "--key", "x"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["sample"] + [f"y[{j}]" for j in range(10)]
    assert len(lines) == 361
    row = lines[5].split()
    assert row[0] == "4" and np.allclose([float(v) for v in row[1:]], data["keras"][4], rtol=1e-4, atol=1e-6)


def test_predict_reads_csv_with_a_header(digits_malinn, tmp_path):
    data = np.load(ROOT / "examples" / "digits_test.npz")
    x = data["x"][:7]
    lines = [",".join(f"p{i}" for i in range(64))] + [",".join(repr(float(v)) for v in row) for row in x]
    (tmp_path / "x.csv").write_text("\n".join(lines) + "\n")
    out = malinn("predict", digits_malinn, tmp_path / "x.csv", "-o", tmp_path / "y.npy")
    assert out.returncode == 0, out.stderr
    assert np.abs(np.load(tmp_path / "y.npy") - data["keras"][:7]).max() <= 1e-5


def test_a_command_started_with_stdout_closed_succeeds(digits_malinn, tmp_path):
    """Its report goes nowhere, and the work is done: exit 0 (it was 1, "please report this as a
    malinn bug", after the file was written)."""
    out = tmp_path / "again.malinn"
    done = subprocess.run(
        f'"{sys.executable}" -m malinn.cli convert "{DIGITS}" -o "{out}" >&-',
        shell=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stderr == "" and out.is_file(), done.stderr


def test_convert_of_a_large_source_says_what_it_does_before_each_phase(monkeypatch, tmp_path, capsys):
    """Reading, laying out and writing take seconds each for a source of many MiB: each phase is
    named on stderr before it runs (a source under CONVERT_ANNOUNCED_BYTES, the digits, says nothing)."""
    from malinn.cli import commands as cli
    from malinn.cli import convert_command

    assert cli.main(["convert", str(DIGITS), "-o", str(tmp_path / "small.malinn"), "--target", "cpu"]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(
        convert_command, "CONVERT_ANNOUNCED_BYTES", DIGITS.stat().st_size
    )  # as if the digits were that large
    assert cli.main(["convert", str(DIGITS), "-o", str(tmp_path / "large.malinn"), "--target", "cpu"]) == 0
    kib = DIGITS.stat().st_size / 1024
    assert capsys.readouterr().err.splitlines() == [
        f"malinn convert: reading {DIGITS} ({kib:.1f} KiB)...",
        f"malinn convert: laying out the weights of 4 layers in fp32 and writing {tmp_path / 'large.malinn'}...",
    ]


def test_an_empty_device_name_is_refused_not_ignored(digits_malinn, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 64), np.float32))
    out = malinn("predict", digits_malinn, tmp_path / "x.npy", "-o", tmp_path / "y.npy", "--device", "")
    assert out.returncode == 1 and "no working device matches ''" in out.stderr, out.stderr
    assert not (tmp_path / "y.npy").exists()


def test_predict_writes_every_output_of_a_layer_called_twice(tmp_path):
    """A shared head computing two outputs: both reach the .npz (the second overwrote the first)."""
    from malinn.layers import Dense

    x, y = malinn_api.Input((5,), name="x"), malinn_api.Input((5,), name="y")
    head = Dense(3, name="head")
    model = malinn_api.Functional([x, y], [head(x), head(y)])
    model.set_weights([w + 1.0 for w in model.get_weights()])
    path = model.save(tmp_path / "shared.malinn")
    inputs = {"x": np.arange(10, dtype=np.float32).reshape(2, 5), "y": np.ones((2, 5), np.float32)}
    np.savez(tmp_path / "in.npz", **inputs)
    out = malinn("predict", path, tmp_path / "in.npz", "-o", tmp_path / "out.npz")
    assert out.returncode == 0, out.stderr
    written = np.load(tmp_path / "out.npz")
    assert sorted(written.files) == ["head", "head_1"]
    want = model.predict(inputs)
    np.testing.assert_allclose(written["head"], want[0], rtol=1e-6)
    np.testing.assert_allclose(written["head_1"], want[1], rtol=1e-6)


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("x.npy", b"", "x.npy is empty"),
        ("m.malinn", b"\x89HDF", "m.malinn is not an input array file: expected .npy, .npz or .csv"),
        ("x.csv", b"1,2\n3,x\n", "line 2: 'x' is not a number"),
        # a first row with a number in it is data, not a header to drop (it was dropped, silently)
        ("x.csv", b"1,NA\n3,4\n", "line 1: 'NA' is not a number"),
        ("x.csv", b"1,\n3,4\n", "line 1: '' is not a number"),
        # numbers separated otherwise read as a header, then a row that was not a number
        ("x.csv", b"0.5;1;2\n3;4;5\n", "line 1 holds numbers separated by semicolons; malinn reads comma-separated"),
        ("x.csv", b"0.5\t1\n3\t4\n", "line 1 holds numbers separated by tabs"),
    ],
)
def test_predict_input_errors_are_one_line_and_never_mention_pickle(digits_malinn, tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    out = malinn("predict", digits_malinn, tmp_path / name, "-o", tmp_path / "y.npy")
    assert out.returncode == 1 and out.stderr.startswith("malinn: error: ") and message in out.stderr
    assert len(out.stderr.splitlines()) == 1 and "pickle" not in out.stderr
    assert not (tmp_path / "y.npy").exists()


def test_predict_to_a_closed_pipe_is_quiet(digits_malinn, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((30000, 64), np.float32))  # 1.2 MB of output: more than a pipe holds
    proc = subprocess.Popen(
        [sys.executable, "-m", "malinn.cli", "predict", str(digits_malinn), str(tmp_path / "x.npy")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "MALINN_PROGRESS": "0"},
    )  # no build summary either
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and err == b""


# ------------------------------------------------------------------ convert: destinations
def test_convert_writes_beside_the_source_unless_told_where(tmp_path):
    """``malinn convert model.keras`` (the README's first step) writes model.malinn beside it; the
    output may also follow the source, as cp's does; two different outputs are a usage error."""
    src = tmp_path / "model.keras"
    src.write_bytes(DIGITS.read_bytes())
    out = malinn("convert", src, "--target", "gpu")
    assert out.returncode == 0 and (tmp_path / "model.malinn").is_file(), out.stderr
    assert f"-> {tmp_path / 'model.malinn'}:" in out.stdout
    out = malinn("convert", src, tmp_path / "other.malinn", "--target", "gpu")
    assert out.returncode == 0 and (tmp_path / "other.malinn").is_file(), out.stderr
    out = malinn("convert", src, tmp_path / "a.malinn", "-o", tmp_path / "b.malinn", "--target", "gpu")
    assert out.returncode == 2 and "two outputs" in out.stderr
    assert not (tmp_path / "a.malinn").exists() and not (tmp_path / "b.malinn").exists()
    mine = tmp_path / "m.malinn"  # a malinn file's default is itself: refused
    mine.write_bytes((tmp_path / "model.malinn").read_bytes())
    out = malinn("convert", mine, "--target", "gpu")
    assert out.returncode == 1 and "refusing to overwrite" in out.stderr


def test_convert_refuses_its_source_unless_forced(tmp_path):
    src = tmp_path / "m.keras"
    src.write_bytes(DIGITS.read_bytes())
    out = malinn("convert", src, "-o", src, "--target", "gpu")
    assert out.returncode == 1 and "refusing to overwrite" in out.stderr and "--force" in out.stderr
    assert src.read_bytes() == DIGITS.read_bytes()
    out = malinn("convert", src, "-o", src, "--target", "gpu", "--force")
    assert out.returncode == 0, out.stderr
    assert src.read_bytes() != DIGITS.read_bytes()


def test_convert_to_a_character_device_keeps_the_node(tmp_path):
    node = tmp_path / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError:
        node = Path("/dev/null")
    out = malinn("convert", DIGITS, "-o", node, "--target", "gpu")
    assert out.returncode == 0, out.stderr
    assert stat.S_ISCHR(os.stat(node).st_mode) and os.stat(node).st_rdev == os.makedev(1, 3)
    assert sorted(p.name for p in node.parent.iterdir() if ".malinn-" in p.name) == []


def test_convert_with_a_target_needs_no_opencl_device(tmp_path):
    no_driver = {"OCL_ICD_VENDORS": str(tmp_path / "no-vendors"), "OCL_ICD_FILENAMES": str(tmp_path / "none.so")}
    if malinn("devices", env=no_driver).returncode == 0:
        pytest.skip("the OpenCL loader here ignores OCL_ICD_VENDORS: cannot hide the devices")
    out = malinn("convert", DIGITS, "-o", tmp_path / "d.malinn", "--target", "gpu", env=no_driver)
    assert out.returncode == 0, out.stderr
    assert "weights laid out for" in out.stdout
    out = malinn("convert", DIGITS, "-o", tmp_path / "e.malinn", env=no_driver)  # no target: needs a device
    assert out.returncode == 1 and "no working OpenCL device" in out.stderr.splitlines()[-1]


# ------------------------------------------------------------------ devices, tune
@pytest.mark.parametrize("setting", ["garbage", "no-such-gpu"])
def test_devices_lists_when_malinn_device_matches_nothing(setting):
    out = malinn("devices", env={"MALINN_DEVICE": setting})
    assert out.returncode == 0
    assert out.stdout.startswith("  [") and "* " not in out.stdout
    assert out.stderr.count("\n") == 1 and f"MALINN_DEVICE={setting!r} matches none" in out.stderr


@pytest.mark.parametrize(
    "args, status, message",
    [
        (["--batch", "0", "--model", DIGITS], 2, "argument --batch: expected a positive integer"),
        (["--budget", "-1"], 2, "argument --budget: expected a positive number of seconds"),
        (["--budget", "nan"], 2, "argument --budget"),
        (["--shape", "0x1x1"], 2, "argument --shape: expected MxKxN"),
        (["--shape", "100000x100000x100000"], 1, "exceeds"),
        (["--shape", "8x8x8", "--model", DIGITS], 2, "give --model or --shape, not both"),
        (["--batch", "5", "--shape", "8x8x8"], 2, "tune: --batch is the batch a --model is tuned for"),  # was ignored
        (
            ["--model", DIGITS, "--batch", "9223372036854775807"],
            2,  # was numpy's "Maximum allowed dimension exceeded"
            "tune: --batch 9223372036854775807 is more samples than one pass of",
        ),
    ],
)
def test_tune_fails_up_front(args, status, message):
    start = time.perf_counter()
    out = malinn("tune", *args)
    assert out.returncode == status and message in out.stderr and len(out.stderr.splitlines()) == 1
    assert "tuning matmul" not in out.stdout and time.perf_counter() - start < 60


def test_tune_refuses_a_cache_dir_that_is_a_file(tmp_path):
    (tmp_path / "cache").write_text("not a folder")
    out = malinn("tune", "--quick", env={"MALINN_CACHE_DIR": str(tmp_path / "cache")})
    assert out.returncode == 1 and "is a file, not a folder" in out.stderr and out.stdout == ""
    assert (tmp_path / "cache").read_text() == "not a folder"


# ------------------------------------------------------------------ verify
def test_verify_says_it_needs_the_keras_file(digits_malinn):
    out = malinn("verify", digits_malinn)
    assert out.returncode == 1 and "needs the original Keras file" in out.stderr
    assert len(out.stderr.splitlines()) == 1


def test_verify_input_npz_needs_a_key(tmp_path):
    out = malinn("verify", DIGITS, "--input", ROOT / "examples" / "digits_test.npz")
    assert out.returncode == 1 and "choose one with --key NAME" in out.stderr and "Traceback" not in out.stderr


def test_verify_prints_errors_after_every_layer_and_runs_no_code_from_the_cwd(tmp_path):
    """Run in a folder holding modules named keras, tf_keras and tensorflow (one TensorFlow start
    serves both checks)."""
    marker = tmp_path / "MARKER"
    for module in ("keras", "tf_keras", "tensorflow"):
        (tmp_path / f"{module}.py").write_text(f"open({str(marker)!r}, 'a').write('{module} ran\\n')\n")
    (tmp_path / "model.keras").write_bytes(DIGITS.read_bytes())
    np.save(tmp_path / "x.npy", np.load(ROOT / "examples" / "digits_test.npz")["x"][:4])
    out = malinn(
        "verify",
        "model.keras",
        "--input",
        "x.npy",
        cwd=tmp_path,
        env={"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
    )
    assert not marker.exists(), marker.read_text()
    assert "malinn verify: running the model in Keras (a TensorFlow process" in out.stderr, (
        out.stderr
    )  # before it starts
    if HAS_TF:
        assert out.returncode == 0, out.stdout + out.stderr
        lines = out.stdout.splitlines()
        for name in ("dense", "activation", "dense_1", "dense_2", "(model output)"):
            assert any(line.startswith(name + " ") for line in lines[2:]), out.stdout
        assert "(not compared)" not in out.stdout, out.stdout  # every layer of a chain compared
        assert lines[-1].startswith("OK: worst rel error")
    else:
        assert out.returncode == 1 and "verify needs TensorFlow" in out.stderr


@pytest.mark.skipif(not HAS_TF, reason="verify needs tensorflow (test extra)")
def test_verify_names_the_keras_layers_each_step_covers_and_fails_on_a_mismatch(keras_zoo, tmp_path):
    """Tolerance 0: a folded BatchNormalization rounds differently from Keras, so verify prints
    every row and then fails (one TensorFlow start serves both checks)."""
    path = keras_zoo.path("keras3-zip", "batchnorm")
    out = malinn("verify", path, "--tolerance", "0")
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1].startswith("MISMATCH: worst rel error"), out.stdout
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[2:-1]}
    assert "d_lin + bn_folded (folded)" in rows["d_lin"]
    assert "d_nobias + bn_nocenter_folded (folded)" in rows["d_nobias"]
    assert "(folded)" not in rows["d_tanh"]


# ------------------------------------------------------------------ signals
@pytest.mark.parametrize(
    "signum, status, said",
    [
        (signal.SIGINT, 130, "interrupted"),
        (signal.SIGTERM, 143, "terminated (SIGTERM)"),
        (signal.SIGHUP, 129, "terminated (SIGHUP)"),
    ],
)
def test_ctrl_c_is_one_line_and_exit_130(digits_malinn, tmp_path, signum, status, said):
    """Ctrl-C, and SIGTERM (a service stopped) and SIGHUP (an ssh connection dropped) as it: one line,
    the shell's status, nothing left behind (their default ended the process at once, leaving a
    half-written temporary file beside the destination until the hourly sweep)."""
    fifo = tmp_path / "x.npy"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [sys.executable, "-m", "malinn.cli", "predict", str(digits_malinn), str(fifo), "-o", str(tmp_path / "y.npy")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while True:  # opens the FIFO once malinn opens it for reading; malinn then waits in read()
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    try:
        time.sleep(0.2)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(writer)
    assert proc.returncode == status and err.decode() == f"malinn: error: {said}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy"]


def test_summary_says_why_the_device_shows_no_kernels(digits_malinn):
    """A precision the device cannot run: the layers, then the device's reason (the kernel column
    was empty, with no word of why)."""
    devices = malinn("devices").stdout
    if "cl_khr_fp16" in devices:
        pytest.skip("the default device computes in half")
    out = malinn("summary", digits_malinn, "--precision", "fp16")
    assert out.returncode == 0 and "dense" in out.stdout
    assert "No kernels on " in out.stdout and "needs cl_khr_fp16" in out.stdout


def test_summary_of_a_reduced_precision_on_an_opengl_device_shows_the_layers_and_why(digits_malinn):
    if "gl" not in malinn("devices").stdout:
        pytest.skip("no OpenGL device here")
    out = malinn("summary", digits_malinn, "--precision", "int8-weights", "--device", "gl")
    assert out.returncode == 0 and "dense" in out.stdout, out.stderr
    assert "No kernels on " in out.stdout and "runs on OpenCL devices" in out.stdout


def test_a_misspelled_option_is_named_with_its_command(tmp_path):
    """'malinn convert ... --precison int8-weights' said 'unrecognized arguments ... (see malinn
    --help)', whose help lists no convert option."""
    out = malinn("convert", DIGITS, "-o", tmp_path / "x.malinn", "--precison", "int8-weights")
    assert out.returncode == 2 and out.stderr == (
        "malinn: error: convert: unrecognized arguments: --precison int8-weights (see malinn convert --help)\n"
    )
    assert not (tmp_path / "x.malinn").exists()


def test_tune_budget_covers_the_whole_run(monkeypatch, tmp_path, capsys):
    """--budget S with --model: the convolutions get what the matmuls left (each phase started its
    own clock, so a run took about twice S)."""
    from malinn.cli import commands as cli
    from malinn.cli import tune_command

    clock = [100.0]
    monkeypatch.setattr(tune_command.time, "perf_counter", lambda: clock[0])
    monkeypatch.setenv("MALINN_CACHE_DIR", str(tmp_path))
    budgets = {}

    def matmuls(device, shapes, quick, budget_s, per_shape, precision):
        budgets["matmuls"] = budget_s
        clock[0] += 12.0  # the matmuls took 12 s of it
        return {"shapes": {}, "kept": [], "untuned": [], "candidates": 0, "path": "p"}

    def convs(geometries, device, quick, budget_s, stream):
        budgets["convs"] = budget_s
        return {"convs": {}, "untuned": [], "candidates": 0, "path": "p"}

    monkeypatch.setattr(tune_command, "tune", matmuls)
    monkeypatch.setattr(tune_command, "tune_convs", convs)
    assert cli.main(["tune", "--model", str(ROOT / "examples" / "digits_cnn.keras"), "--budget", "20"]) == 0
    assert budgets == {"matmuls": 20.0, "convs": 8.0}


def test_a_wrong_kernels_folder_is_not_blamed_on_the_model_file(digits_malinn, tmp_path):
    out = malinn(
        "predict",
        digits_malinn,
        ROOT / "examples" / "digits_test.npz",
        "--key",
        "x",
        "-o",
        tmp_path / "y.npy",
        env={"MALINN_KERNELS": str(tmp_path / "nowhere")},
    )
    assert out.returncode == 1 and "MALINN_KERNELS names" in out.stderr and "damaged" not in out.stderr


@pytest.mark.skipif(not HAS_TF, reason="verify needs tensorflow (test extra)")
def test_verify_says_keras_computed_in_half_and_takes_its_tolerance(keras_zoo):
    """A model of bfloat16 layers: Keras computes them in bfloat16, malinn in float32. verify said
    'keras in float32' and failed at fp32's 1e-5 (a mixed_float16 model: MISMATCH at 3e-4)."""
    out = malinn("verify", keras_zoo.path("keras3-zip", "bfloat16"))
    assert out.returncode == 0, out.stdout + out.stderr
    header = out.stdout.splitlines()[0]
    assert "keras in bfloat16" in header and "keras in float32" not in header, header
    assert "malinn computes them in float32" in out.stdout and "(tolerance 0.05)" in out.stdout.splitlines()[-1]


def test_the_default_output_of_a_folder_is_named_beside_it(tmp_path, monkeypatch):
    """An unzipped .keras folder, given as ``.`` from inside it, failed with "PosixPath('.') has an
    empty name"; ``/`` has no name to take and is a usage error."""
    from malinn.cli.arguments import UsageError
    from malinn.cli.convert_command import default_output as _default_output

    (tmp_path / "unz").mkdir()
    monkeypatch.chdir(tmp_path / "unz")
    assert _default_output(".") == str(tmp_path / "unz.malinn")
    assert _default_output("m.keras") == "m.malinn" and _default_output("m") == "m.malinn"
    with pytest.raises(UsageError, match="has no name to give the output"):
        _default_output("/")


def test_a_csv_cell_far_longer_than_the_rest_costs_no_more_memory_than_its_text(tmp_path):
    """Every cell went into one fixed-width string array as wide as the longest: a 2 MB file with one
    cell of 2,000 characters took 8 GB before its shape was refused."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc here to read a process's peak memory from")
    path = tmp_path / "long.csv"
    path.write_text("0,1,2\n" * 2000 + "3,4," + " " * 50000 + "5\n")  # before: 6,003 cells x 50,005 x 4 bytes
    script = (
        "import sys\nfrom malinn.io.array_files import read_input_array\nx = read_input_array(sys.argv[1])\n"
        "print(x.shape, x[-1].tolist())\n"
        "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=300)
    shape, peak_kib = out.stdout.splitlines()[:2]
    assert shape == "(2001, 3) [3.0, 4.0, 5.0]", out.stdout + out.stderr
    assert int(peak_kib) < 400 * 1024, f"peak {int(peak_kib) // 1024} MiB"


@pytest.mark.parametrize("shape, fragment", [((2**32, 2**32, 1), "bytes of data"), ((-1, 3), "has a negative size")])
def test_an_npy_header_of_an_impossible_shape_is_named_with_its_file(tmp_path, shape, fragment):
    """numpy's int64 product wrapped to 0 for (2**32, 2**32, 1), and a negative size reached read():
    errors that did not name the file."""
    import io

    from malinn.errors import MalinnError
    from malinn.io.array_files import read_input_array

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False, "shape": shape})
    path = tmp_path / "x.npy"
    path.write_bytes(buffer.getvalue() + bytes(16))
    with pytest.raises(MalinnError, match=f"x.npy: damaged .npy header .*{fragment}"):
        read_input_array(path)


# ------------------------------------------------------------------ the console command, - for stdin and stdout
def test_the_console_command_is_the_main_module_that_takes_ctrl_c_first():
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"malinn": "malinn.__main__:main"}


def test_ctrl_c_at_any_moment_of_the_command_is_one_line_and_exit_130(tmp_path):
    """Ctrl-C while the command imported numpy, pyopencl and h5py (its first few tenths of a second)
    printed a KeyboardInterrupt traceback and the process died of the signal. The script is the one
    pip writes for the console command; the signal is sent from the moment the launcher has taken
    SIGTERM (what Python does before that, starting, is Python's own)."""
    if not os.path.exists(f"/proc/{os.getpid()}/status"):
        pytest.skip("no /proc here to see when the launcher has taken the signals")
    script = tmp_path / "malinn"
    script.write_text(
        f"import re\nimport sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom malinn.__main__ import main\n"
        "if __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
        "    sys.exit(main())\n"
    )

    def caught(pid: int) -> int:
        """The signals the process has handlers for (/proc's SigCgt mask); 0 once it is gone."""
        try:
            with open(f"/proc/{pid}/status") as status:
                return next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
        except (OSError, StopIteration):
            return 0

    statuses = []
    for delay in (0.0, 0.02, 0.05, 0.08, 0.12, 0.16, 0.2, 0.25, 0.3):
        proc = subprocess.Popen(
            [
                sys.executable,
                str(script),
                "convert",
                str(DIGITS),
                "-o",
                str(tmp_path / "d.malinn"),
                "--target",
                "cpu",
                "--force",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 60
        while not caught(proc.pid) & (1 << (signal.SIGTERM - 1)) and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        statuses.append(proc.returncode)
        # interrupted, or done before the signal came (its report on stdout, stderr empty)
        assert (proc.returncode, err.decode()) in ((130, "malinn: error: interrupted\n"), (0, "")), (
            f"at {delay} s: {proc.returncode} {err.decode()}"
        )
    assert statuses.count(130) >= 3, statuses


def run_cli(*args, stdin=None, cwd=None, stdout=subprocess.PIPE):
    return subprocess.run(
        [sys.executable, "-m", "malinn.cli", *map(str, args)],
        input=stdin,
        stdout=stdout,
        stderr=subprocess.PIPE,
        cwd=cwd,
        timeout=300,
    )


def test_a_dash_is_stdin_where_a_file_is_read_and_stdout_where_one_is_written(tmp_path):
    """``-o -`` and ``convert -`` wrote a file named "-". Formats that need seeking read a copy of
    stdin; a - that cannot be served is a usage error."""
    keras = DIGITS.read_bytes()
    data = ROOT / "examples" / "digits_test.npz"
    out = run_cli("convert", "-", "-o", "from_stdin.malinn", "--target", "cpu", stdin=keras, cwd=tmp_path)
    assert out.returncode == 0 and b"stdin.keras -> from_stdin.malinn: 4 layers" in out.stdout, out.stderr
    out = run_cli("convert", DIGITS, "-o", "-", "--target", "cpu", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith(b"\x89HDF") and b"-> stdout: 4 layers" in out.stderr
    (tmp_path / "to_stdout.malinn").write_bytes(out.stdout)
    want = malinn_api.load_model(tmp_path / "from_stdin.malinn").predict(np.load(data)["x"])
    out = run_cli("predict", "to_stdout.malinn", data, "--key", "x", "-o", "-", cwd=tmp_path)
    assert out.returncode == 0 and b"written to stdout (.npy)" in out.stderr
    np.testing.assert_array_equal(np.load(io.BytesIO(out.stdout)), want)
    out = run_cli("predict", "-", data, "--key", "x", stdin=(tmp_path / "to_stdout.malinn").read_bytes(), cwd=tmp_path)
    assert out.returncode == 0
    np.testing.assert_array_equal(np.load(io.BytesIO(out.stdout)), want)
    with open(data, "rb") as npz:
        x = np.load(npz)["x"]
    buffer = io.BytesIO()
    np.save(buffer, x)
    out = run_cli("predict", "to_stdout.malinn", "-", stdin=buffer.getvalue(), cwd=tmp_path)
    assert out.returncode == 0
    np.testing.assert_array_equal(np.load(io.BytesIO(out.stdout)), want)
    for args, message in (
        (
            ["convert", "-", "--target", "cpu"],
            "convert: the source is standard input (-), which has no name to give the output",
        ),
        (["predict", "-", "-"], "predict: model and input are each - (standard input), which holds one file"),
    ):
        out = run_cli(*args, stdin=keras, cwd=tmp_path)
        assert out.returncode == 2 and out.stderr.decode().startswith(f"malinn: error: {message}"), out.stderr
        assert len(out.stderr.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["from_stdin.malinn", "to_stdout.malinn"]


def test_a_report_stdout_cannot_take_says_the_file_was_written(tmp_path):
    """``convert ... > /dev/full`` wrote the file and said only "[Errno 28] No space left on device"."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "wb") as full:
        out = run_cli("convert", DIGITS, "-o", tmp_path / "d.malinn", "--target", "cpu", stdout=full)
    assert out.returncode == 1 and out.stderr.decode() == (
        f"malinn: error: {tmp_path / 'd.malinn'} is written, but its "
        "report could not be written to stdout (No space left on "
        "device)\n"
    )
    assert len(malinn_api.load_model(tmp_path / "d.malinn").layers) == 4


#: the command line in a child process with chunks of CHUNK_BYTES (argv[1]) and, on stderr's last
#: line, the memory it allocated at its peak beyond what it held before (tracemalloc, where numpy
#: reports its arrays' data), in a second run after one on argv[2]'s file (the imports, the device
#: and the kernels then cost nothing); with argv[2] "interrupt", one run, and Ctrl-C arrives once the
#: output's temporary file holds a chunk
STREAMING_CHILD = r"""
import os, signal, sys, threading, time, tracemalloc
import malinn.cli.streaming as streaming
from malinn.cli.commands import main
streaming.CHUNK_BYTES = int(sys.argv[1])
tracemalloc.start()
if sys.argv[2] not in ("run", "interrupt"):   # the same command on a small file first
    warm = sys.argv[3:]
    warm[warm.index("predict") + 2] = sys.argv[2]
    assert main(warm) == 0
if sys.argv[2] == "interrupt":
    folder = os.path.dirname(sys.argv[-1])
    def interrupt():
        while not any(n.endswith(".tmp") and os.path.getsize(os.path.join(folder, n)) > 4096
                      for n in os.listdir(folder)):
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=interrupt, daemon=True).start()
before = tracemalloc.get_traced_memory()[0]
tracemalloc.reset_peak()
status = main(sys.argv[3:])
print(f"peak {tracemalloc.get_traced_memory()[1] - before}", file=sys.stderr)
sys.exit(status)
"""


def streaming_child(*args):
    return subprocess.run(
        [sys.executable, "-c", STREAMING_CHILD, *map(str, args)], capture_output=True, text=True, timeout=300
    )


def streaming_model(path):
    model = malinn_api.Sequential(
        [malinn_api.layers.Dense(64, activation="relu"), malinn_api.layers.Dense(10, activation="softmax")]
    )
    model.build((None, 512))
    rng = np.random.default_rng(0)
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.05 for w in model.get_weights()])
    model.save(path)
    return model


def test_predict_streams_a_large_npy_in_bounded_memory(tmp_path):
    """A .npy to a .npy is read and written in chunks: the output equals an in-memory predict, and
    the memory the command allocates stays far below the input's size."""
    model = streaming_model(tmp_path / "m.malinn")
    x = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float32, shape=(24576, 512))
    x[:] = np.random.default_rng(1).uniform(-1, 1, x.shape)
    x.flush()
    np.save(tmp_path / "small.npy", x[:100])
    chunk = 2 * 2**20  # 1024 samples: 24 chunks of 2 MiB, the input 48 MiB
    out = streaming_child(
        chunk,
        tmp_path / "small.npy",
        "predict",
        tmp_path / "m.malinn",
        tmp_path / "x.npy",
        "-o",
        tmp_path / "y.npy",
        "--batch-size",
        512,
    )
    assert out.returncode == 0, out.stderr
    y = np.load(tmp_path / "y.npy")
    np.testing.assert_array_equal(y, model.predict(np.asarray(x), batch_size=512))
    assert y.shape == (24576, 10) and "(24576, 512) -> (24576, 10) written to" in out.stdout
    lines = out.stderr.splitlines()
    assert lines[-2].startswith("24/24 " + "━" * 20), out.stderr  # the progress bar's last line
    peak = int(lines[-1].split()[1])
    # two input chunks, a pass's staging arrays and a chunk's outputs: about 5.5 MiB
    assert peak < x.nbytes / 6, f"the command allocated {peak:,} bytes at its peak for a {x.nbytes:,}-byte input"


def test_predict_streaming_interrupted_leaves_no_file(tmp_path):
    streaming_model(tmp_path / "m.malinn")
    np.save(tmp_path / "x.npy", np.random.default_rng(2).uniform(-1, 1, (8192, 512)).astype(np.float32))
    out = streaming_child(
        64 * 2048,
        "interrupt",
        "predict",
        tmp_path / "m.malinn",
        tmp_path / "x.npy",
        "--batch-size",
        64,
        "-o",
        tmp_path / "y.npy",
    )
    assert out.returncode == 130 and "malinn: error: interrupted" in out.stderr, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.malinn", "x.npy"]
    # a header that declares more samples than the file holds: refused before anything is written
    with open(tmp_path / "x.npy", "r+b") as f:
        f.truncate(f.seek(0, 2) - 4)
    out = malinn("predict", tmp_path / "m.malinn", tmp_path / "x.npy", "-o", tmp_path / "y.npy")
    assert out.returncode == 1 and "truncated: the header declares shape (8192, 512)" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.malinn", "x.npy"]
