"""The malinn command under attack: every subcommand x garbage flags, bad files and environments.

Each case asserts the exit status (1: a malinn error, 2: a usage error), exactly one line on
stderr that starts ``malinn: error:`` (one-line ``malinn: warning:`` lines aside), never a
traceback, and no file left behind in the output or input folders. Most cases call
``malinn.cli.commands.main`` in this process (cheap); a few run the real command in a subprocess.
"""

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import malinn
import malinn.backends.selection
from malinn.cli.commands import main

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits_mlp.keras"


def _npy_with_header(header: str, data: bytes) -> bytes:
    text = header.encode("latin1")
    pad = 64 - (10 + len(text) + 1) % 64
    text += b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + data


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A folder of good and bad inputs and models; returns it."""
    d = tmp_path_factory.mktemp("fuzz-in")
    rng = np.random.default_rng(7)
    malinn.convert(DIGITS, d / "good.malinn", target="gpu")
    np.save(d / "good.npy", rng.standard_normal((3, 64)).astype(np.float32))
    (d / "empty.npy").write_bytes(b"")
    (d / "binary.npy").write_bytes(rng.bytes(4096))
    (d / "magic_only.npy").write_bytes(b"\x93NUMPY")
    (d / "bad_header.npy").write_bytes(_npy_with_header("{'descr': <f4, 'shape': (", b""))
    (d / "truncated.npy").write_bytes((d / "good.npy").read_bytes()[:-17])
    (d / "huge_declared.npy").write_bytes(
        _npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000, 64), }", b"\0" * 256)
    )
    np.save(d / "object.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    np.save(d / "text.npy", np.array(["1", "2"]))
    np.save(d / "complex.npy", np.ones((2, 64), np.complex64))
    np.save(d / "records.npy", np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]))
    np.save(d / "scalar.npy", np.float32(1))
    np.save(d / "no_samples.npy", np.zeros((0, 64), np.float32))
    np.save(d / "wrong_width.npy", np.zeros((2, 63), np.float32))
    (d / "png.npy").write_bytes(b"\x89PNG\r\n\x1a\n" + rng.bytes(200))
    np.savez(d / "two.npz", a=np.zeros((2, 64)), b=np.zeros((2, 64)))
    np.savez(d / "text.npz", x=np.array(["a", "b"]))
    np.savez(d / "none.npz")
    (d / "binary.npz").write_bytes(rng.bytes(2_000_000))
    (d / "empty.npz").write_bytes(b"")
    (d / "empty.csv").write_bytes(b"")
    (d / "binary.csv").write_bytes(rng.bytes(3000))
    (d / "ragged.csv").write_text("1,2,3\n4,5\n")
    (d / "words.csv").write_text("a,b\nc,d\ne,f\n")
    (d / "narrow.csv").write_text("1,2,3\n4,5,6\n")
    rows = "\n".join([",".join(["0.5"] * 64)] * 20000)
    (d / "big_bad.csv").write_text(rows + "\n" + ",".join(["0.5"] * 63 + ["oops"]) + "\n")  # 2.5 MB
    (d / "x.malinn").write_bytes((d / "good.malinn").read_bytes())
    (d / "x.txt").write_text("1,2,3\n")
    (d / "folder.npy").mkdir()
    (d / "empty.keras").write_bytes(b"")
    (d / "garbage.h5").write_bytes(rng.bytes(5000))
    (d / "garbage.keras").write_bytes(b"PK\x03\x04" + rng.bytes(5000))
    (d / "garbage.malinn").write_bytes(rng.bytes(5000))
    (d / "half.malinn").write_bytes((d / "good.malinn").read_bytes()[:3000])
    return d


IN, OUT = "{in}", "{out}"

# (id, argv with {in}/{out} placeholders, exit status)
CASES = (
    [
        # top level and usage
        ("no-command", [], 2),
        ("unknown-command", ["bogus"], 2),
        ("unknown-flag", ["--bogus"], 2),
        ("devices-extra", ["devices", "extra"], 2),
        ("devices-flag", ["devices", "--bogus"], 2),
        # convert
        ("convert-two-outputs", ["convert", str(DIGITS), OUT + "/a.malinn", "-o", OUT + "/b.malinn"], 2),
        ("convert-empty-positional-output", ["convert", str(DIGITS), ""], 1),
        ("convert-unknown-flag", ["convert", str(DIGITS), "-o", OUT + "/m.malinn", "--bogus"], 2),
        ("convert-missing-src", ["convert", IN + "/missing.keras", "-o", OUT + "/m.malinn"], 1),
        ("convert-empty-src", ["convert", IN + "/empty.keras", "-o", OUT + "/m.malinn"], 1),
        ("convert-garbage-h5", ["convert", IN + "/garbage.h5", "-o", OUT + "/m.malinn"], 1),
        ("convert-garbage-zip", ["convert", IN + "/garbage.keras", "-o", OUT + "/m.malinn"], 1),
        ("convert-folder-src", ["convert", IN + "/folder.npy", "-o", OUT + "/m.malinn"], 1),
        ("convert-npy-src", ["convert", IN + "/good.npy", "-o", OUT + "/m.malinn"], 1),
        ("convert-bad-target", ["convert", str(DIGITS), "-o", OUT + "/m.malinn", "--target", "tpu"], 1),
        ("convert-empty-output", ["convert", str(DIGITS), "-o", ""], 1),
        ("convert-output-slash", ["convert", str(DIGITS), "-o", OUT + "/newdir/"], 1),
        ("convert-output-folder", ["convert", str(DIGITS), "-o", OUT], 1),
        ("convert-output-missing-folder", ["convert", str(DIGITS), "-o", OUT + "/missing/m.malinn"], 1),
        ("convert-output-too-long", ["convert", str(DIGITS), "-o", OUT + "/" + "n" * 300], 1),
        ("convert-onto-source", ["convert", IN + "/x.malinn", "-o", IN + "/x.malinn", "--target", "gpu"], 1),
        ("convert-bad-device", ["convert", str(DIGITS), "-o", OUT + "/m.malinn", "--device", "no-such-device"], 1),
        # predict: flags
        ("predict-missing-input", ["predict", IN + "/good.malinn"], 2),
        ("predict-batch-zero", ["predict", IN + "/good.malinn", IN + "/good.npy", "--batch-size", "0"], 2),
        ("predict-batch-text", ["predict", IN + "/good.malinn", IN + "/good.npy", "--batch-size", "many"], 2),
        ("predict-key-no-value", ["predict", IN + "/good.malinn", IN + "/good.npy", "--key"], 2),
        ("predict-extra-arg", ["predict", IN + "/good.malinn", IN + "/good.npy", "extra"], 2),
        ("predict-bad-device", ["predict", IN + "/good.malinn", IN + "/good.npy", "--device", "9:9"], 1),
        (
            "predict-key-on-npy",
            ["predict", IN + "/good.malinn", IN + "/good.npy", "--key", "x", "-o", OUT + "/y.npy"],
            1,
        ),
        ("predict-output-folder", ["predict", IN + "/good.malinn", IN + "/good.npy", "-o", OUT], 1),
        ("predict-output-empty", ["predict", IN + "/good.malinn", IN + "/good.npy", "-o", ""], 1),
        ("predict-onto-input", ["predict", IN + "/good.malinn", IN + "/good.npy", "-o", IN + "/good.npy"], 1),
        ("predict-onto-model", ["predict", IN + "/good.malinn", IN + "/good.npy", "-o", IN + "/good.malinn"], 1),
        # predict: models
        ("predict-missing-model", ["predict", IN + "/missing.malinn", IN + "/good.npy", "-o", OUT + "/y.npy"], 1),
        ("predict-garbage-model", ["predict", IN + "/garbage.malinn", IN + "/good.npy", "-o", OUT + "/y.npy"], 1),
        ("predict-half-model", ["predict", IN + "/half.malinn", IN + "/good.npy", "-o", OUT + "/y.npy"], 1),
        ("predict-npy-model", ["predict", IN + "/good.npy", IN + "/good.npy", "-o", OUT + "/y.npy"], 1),
    ]
    + [
        # predict: every bad input file
        (f"predict-input-{name}", ["predict", IN + "/good.malinn", IN + "/" + name, "-o", OUT + "/y.npy"], 1)
        for name in [
            "missing.npy",
            "empty.npy",
            "binary.npy",
            "magic_only.npy",
            "bad_header.npy",
            "truncated.npy",
            "huge_declared.npy",
            "object.npy",
            "text.npy",
            "complex.npy",
            "records.npy",
            "scalar.npy",
            "no_samples.npy",
            "wrong_width.npy",
            "png.npy",
            "two.npz",
            "text.npz",
            "none.npz",
            "binary.npz",
            "empty.npz",
            "empty.csv",
            "binary.csv",
            "ragged.csv",
            "words.csv",
            "narrow.csv",
            "big_bad.csv",
            "x.malinn",
            "x.txt",
            "folder.npy",
        ]
    ]
    + [
        # verify (every case fails before Keras would start)
        ("verify-malinn-file", ["verify", IN + "/good.malinn"], 1),
        ("verify-missing-model", ["verify", IN + "/missing.keras"], 1),
        ("verify-garbage-model", ["verify", IN + "/garbage.h5"], 1),
        ("verify-tolerance-nan", ["verify", str(DIGITS), "--tolerance", "nan"], 2),
        ("verify-tolerance-negative", ["verify", str(DIGITS), "--tolerance", "-1"], 2),
        ("verify-key-without-input", ["verify", str(DIGITS), "--key", "x"], 2),
        ("verify-input-empty", ["verify", str(DIGITS), "--input", IN + "/empty.npy"], 1),
        ("verify-input-npz-no-key", ["verify", str(DIGITS), "--input", IN + "/two.npz"], 1),
        ("verify-input-npz-bad-key", ["verify", str(DIGITS), "--input", IN + "/two.npz", "--key", "zz"], 1),
        ("verify-input-malinn", ["verify", str(DIGITS), "--input", IN + "/x.malinn"], 1),
        ("verify-input-binary-csv", ["verify", str(DIGITS), "--input", IN + "/binary.csv"], 1),
        # tune (every case fails before any timing)
        ("tune-batch-zero", ["tune", "--batch", "0"], 2),
        ("tune-budget-negative", ["tune", "--budget", "-1"], 2),
        ("tune-budget-inf", ["tune", "--budget", "inf"], 2),
        ("tune-shape-zero", ["tune", "--shape", "0x1x1"], 2),
        ("tune-shape-two", ["tune", "--shape", "1x2"], 2),
        ("tune-shape-words", ["tune", "--shape", "axbxc"], 2),
        ("tune-shape-huge", ["tune", "--shape", "1000000x1000000x1000000"], 1),
        ("tune-missing-model", ["tune", "--model", IN + "/missing.keras"], 1),
        ("tune-garbage-model", ["tune", "--model", IN + "/garbage.malinn"], 1),
        ("tune-npy-model", ["tune", "--model", IN + "/good.npy"], 1),
        ("tune-bad-device", ["tune", "--device", "no-such-device"], 1),
    ]
)

#: Cases that also run as a real ``malinn`` process.
SUBPROCESS = {
    "no-command",
    "convert-output-slash",
    "convert-garbage-zip",
    "predict-input-empty.npy",
    "predict-input-big_bad.csv",
    "verify-malinn-file",
    "tune-budget-negative",
    "predict-half-model",
}


def _argv(template, files, out):
    return [a.replace(IN, str(files)).replace(OUT, str(out)) for a in template]


def _check(status, err, expected, files, out, before_in):
    lines = [line for line in err.splitlines() if not line.startswith("malinn: warning: ")]
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("malinn: error: "), err
    assert status == expected, err
    assert all(line.startswith("malinn: ") for line in err.splitlines()), err
    assert list(out.iterdir()) == []
    assert sorted(p.name for p in files.iterdir()) == before_in


@pytest.mark.parametrize("argv, status", [pytest.param(a, s, id=i) for i, a, s in CASES])
def test_main_never_raises(argv, status, files, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(
        malinn.backends.selection, "_current", malinn.backends.selection._current
    )  # --device is undone after
    out = tmp_path / "out"
    out.mkdir()
    before_in = sorted(p.name for p in files.iterdir())
    got = main(_argv(argv, files, out))
    _check(got, capsys.readouterr().err, status, files, out, before_in)


def _run(argv, env=None):
    return subprocess.run(
        [sys.executable, "-m", "malinn.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    "case, env, status",
    [
        *[(i, None, s) for i, a, s in CASES if i in SUBPROCESS],
        ("predict-garbage-device", {"MALINN_DEVICE": "garbage"}, 1),
        ("tune-cache-is-a-file", {"MALINN_CACHE_DIR": "{in}/x.txt"}, 1),
        ("predict-kernels-nowhere", {"MALINN_KERNELS": "/nonexistent/kernels"}, 1),  # refused by name
    ],
)
def test_the_command_never_prints_a_traceback(case, env, status, files, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    before_in = sorted(p.name for p in files.iterdir())
    argv = dict((i, a) for i, a, _ in CASES).get(case)
    if argv is None:
        command = case.split("-")[0]
        argv = {
            "predict": ["predict", IN + "/good.malinn", IN + "/good.npy", "-o", OUT + "/y.npy"],
            "tune": ["tune", "--quick"],
        }[command]
    env = {k: v.replace(IN, str(files)) for k, v in (env or {}).items()}
    run = _run(_argv(argv, files, out), env)
    _check(run.returncode, run.stderr, status, files, out, before_in)
