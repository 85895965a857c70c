"""The tuner and its database: what is stored, what the runtime then uses, and what it ignores."""

import io
import json
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
from support import assert_close

import malinn
from malinn import ops
from malinn.choice import tuning_db
from malinn.errors import MalinnError
from malinn.layers import Dense
from malinn.model.model import batch_bucket
from malinn.tuning import tuner


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MALINN_CACHE_DIR", str(tmp_path))
    tuning_db.forget()
    yield tmp_path
    tuning_db.forget()


def device_key(device):
    return device.identity


def database(device, entry) -> dict:
    return {"format": "malinn-tuning", "version": 1, "devices": {device_key(device): entry}}


def test_tune_stores_a_correct_winner_that_the_runtime_uses(device, cache):
    progress = _Terminal()  # a line per candidate on a terminal (a log gets one a quarter)
    best = tuner.tune(device, shapes=[(13, 37, 33), (64, 50, 20)], quick=True, repeat=1, stream=progress)
    assert progress.getvalue().count("[") >= len(malinn.load_library().codenames("matmul"))
    assert "ETA " in progress.getvalue() and "done in" in progress.getvalue()
    stored = json.loads((cache / "tuning.json").read_text())
    assert stored["format"] == "malinn-tuning" and stored["version"] == 1
    entry = stored["devices"][device_key(device)]["general"]
    assert entry["codename"] == best["codename"] and entry["seconds"] > 0 and entry["ranking"]
    assert all(r["seconds"] >= entry["seconds"] for r in entry["ranking"])
    chosen = ops.kernel_for("matmul", device, (64, 64, 64))
    if malinn.load_library()[best["codename"]].accepts(64, 64, 64):
        assert chosen.codename == best["codename"] and chosen.config == {**chosen.config, **best["defines"]}


def test_quick_still_times_every_kernel_and_the_defaults(device):
    library = malinn.load_library()
    quick = tuner._candidates(library, device, quick=True, seed=0)
    full = tuner._candidates(library, device, quick=False, seed=0)
    assert {c for c, _ in quick} == set(library.codenames("matmul", device.backend))  # those it can run
    kind_default = library.default_spec("matmul", device.kind, device.backend)
    for codename in library.codenames("matmul", device.backend):
        spec = library[codename]
        mine = [config for c, config in quick if c == codename]
        if codename == kind_default.codename:  # the device kind's default first of all
            assert mine[0] == kind_default.config and spec.config in mine[:2]
        else:
            assert mine[0] == spec.config  # the entry's own defaults first
        assert len(mine) <= max(1, tuner.QUICK_CONFIGS) and len(mine) == len({json.dumps(c) for c in mine})
    assert len(quick) < len(full)
    assert all(min(s) >= 16 and max(s) <= 1250 for s in tuner.QUICK_SHAPES)


def test_per_shape_tuning_stores_a_winner_per_shape_that_meets_its_preconditions(device, cache):
    shapes = [(40, 50, 30), (40, 50, 1)]
    result = tuner.tune(device, shapes=shapes, quick=True, repeat=1, stream=io.StringIO(), per_shape=True)
    stored = json.loads((cache / "tuning.json").read_text())["devices"][device_key(device)]
    assert "general" not in stored and set(stored["shapes"]) == {"40x50x30", "40x50x1"} == set(result["shapes"])
    library = malinn.load_library()
    for text, won in stored["shapes"].items():
        shape = tuple(int(v) for v in text.split("x"))
        spec = library[won["codename"]].configure(won["defines"])
        assert spec.accepts(*shape, device=device) and won["seconds"] > 0
        assert tuning_db.tuned_choice(device, shape) == (won["codename"], spec.config)
        assert ops.kernel_for("matmul", device, shape).codename == won["codename"]
    assert tuning_db.tuned_choice(device, (7, 7, 7)) is None  # no general winner stored
    tuner.tune(device, shapes=[(40, 50, 30)], quick=True, repeat=1, stream=io.StringIO())
    stored = json.loads((cache / "tuning.json").read_text())["devices"][device_key(device)]
    assert set(stored) == {"general", "shapes"} and len(stored["shapes"]) == 2  # the shapes were kept


def test_a_shape_winner_comes_before_the_general_one(device, cache):
    (cache / "tuning.json").write_text(
        json.dumps(
            database(
                device,
                {
                    "general": {"codename": "crossv", "defines": {}},
                    "shapes": {"150x640x32": {"codename": "rmcm", "defines": {}}},
                },
            )
        )
    )
    assert ops.kernel_for("matmul", device, (150, 640, 32)).codename == "rmcm"
    assert ops.kernel_for("matmul", device, (150, 640, 33)).codename == "crossv"
    assert ops.kernel_for("matmul", device).codename == "crossv"


def test_the_flat_form_of_earlier_versions_is_read_and_upgraded(device, cache):
    other = {"codename": "rmcm", "defines": {}}
    (cache / "tuning.json").write_text(
        json.dumps({device_key(device): {"codename": "crossv", "defines": {}}, "another|device|1": other})
    )
    assert tuning_db.tuned_choice(device) == ("crossv", {})
    tuning_db.save(device, shapes={"3x4x5": {"codename": "cross1", "defines": {}}})
    stored = json.loads((cache / "tuning.json").read_text())
    assert stored["format"] == "malinn-tuning" and stored["devices"]["another|device|1"] == {"general": other}
    assert stored["devices"][device_key(device)]["general"]["codename"] == "crossv"
    assert tuning_db.tuned_choice(device, (3, 4, 5)) == ("cross1", {})


def test_a_database_of_a_newer_malinn_is_ignored_and_never_overwritten(device, cache):
    text = json.dumps({"format": "malinn-tuning", "version": 2, "devices": {}})
    (cache / "tuning.json").write_text(text)
    with pytest.warns(RuntimeWarning, match="version 2, written by a newer malinn"):
        assert tuning_db.tuned_choice(device) is None
    with pytest.raises(MalinnError, match="written by a newer malinn"):
        tuning_db.save(device, general={"codename": "crossv", "defines": {}})
    assert (cache / "tuning.json").read_text() == text


def test_tune_fails_before_any_timing_when_it_could_not_store_the_result(device, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MALINN_CACHE_DIR", str(blocker / "malinn"))
    progress = io.StringIO()
    with pytest.raises(MalinnError, match="is not a folder"):
        tuner.tune(device, shapes=[(8, 8, 8)], quick=True, repeat=1, stream=progress)
    assert progress.getvalue() == "" and blocker.read_text() == "not a folder"
    monkeypatch.setenv("MALINN_CACHE_DIR", str(tmp_path))
    (tmp_path / "tuning.json").write_text(json.dumps({"format": "malinn-tuning", "version": 9, "devices": {}}))
    with pytest.raises(MalinnError, match="newer malinn"):
        tuner.tune(device, shapes=[(8, 8, 8)], quick=True, repeat=1, stream=progress)
    assert progress.getvalue() == ""
    (tmp_path / "tuning.json").unlink()
    (tmp_path / "tuning.json").mkdir()  # the database's path taken by a folder
    with pytest.raises(MalinnError, match="tuning.json is a folder"):
        tuner.tune(device, shapes=[(8, 8, 8)], quick=True, repeat=1, stream=progress)
    assert progress.getvalue() == ""


def test_use_overrides_the_tuned_choice(device, cache):
    (cache / "tuning.json").write_text(json.dumps(database(device, {"general": {"codename": "crossv", "defines": {}}})))
    assert ops.kernel_for("matmul", device).codename == "crossv"
    ops.use("matmul", "rmcm", device)
    assert ops.kernel_for("matmul", device).codename == "rmcm"


GOOD = {"codename": "gemm_tiled", "defines": {"MWG": 64}}
GEMM = "gemm_tiled"


def general(winner):
    return {"general": winner}


# (name, where: the whole file (a string or JSON) / the device's entry in the versioned form / in the flat form,
#  contents, a fragment of the warning)
DAMAGED = [
    ("not JSON", "file", "{ damaged", "not valid JSON"),
    ("empty", "file", "", "not valid JSON"),
    ("nested deeper than Python reads", "file", "[" * 100000 + "]" * 100000, "nested too deeply"),
    ("a list", "file", [GOOD], "expected an object, got a list"),
    ("a JSON string", "file", '"gemm_tiled"', "expected an object, got a string"),
    ("wrong format", "file", {"format": "clblast", "version": 1, "devices": {}}, "'format' is 'clblast'"),
    ("version a string", "file", {"format": "malinn-tuning", "version": "1", "devices": {}}, "version '1'"),
    ("devices a list", "file", {"format": "malinn-tuning", "version": 1, "devices": [GOOD]}, "'devices' is a list"),
    ("flat form: entry a list", "flat", [GOOD], "expected an object, got a list"),
    ("device entry a list", "entry", [GOOD], "ignoring the tuned entry: it is a list"),
    ("device entry null", "entry", None, "ignoring the tuned entry: it is null"),
    ("general a list", "entry", general([GOOD]), "expected an object, got a list"),
    ("non-matmul codename", "entry", general({"codename": "relu"}), "'relu' is not a matmul kernel"),
    ("bias codename", "entry", general({"codename": "bias_add"}), "'bias_add' is not a matmul kernel"),
    ("unknown codename", "entry", general({"codename": "gemm_fast"}), "'gemm_fast' is not a matmul kernel"),
    ("codename a number", "entry", general({"codename": 7}), "'codename' is a number"),
    ("no codename", "entry", general({"defines": {}}), "'codename' is null"),
    ("defines a list", "entry", general({"codename": GEMM, "defines": [64]}), "'defines' is a list"),
    ("define a float", "entry", general({"codename": GEMM, "defines": {"MWG": 64.5}}), "define MWG is a number"),
    ("define a bool", "entry", general({"codename": GEMM, "defines": {"LOCAL": True}}), "define LOCAL is a boolean"),
    ("define an object", "entry", general({"codename": GEMM, "defines": {"MWG": {"a": 1}}}), "define MWG is an object"),
    ("define a word", "entry", general({"codename": GEMM, "defines": {"MWG": "big"}}), "not a configuration"),
    ("unknown define", "entry", general({"codename": GEMM, "defines": {"TILE": 4}}), "not a configuration the library"),
    ("constraint broken", "entry", general({"codename": GEMM, "defines": {"MWG": 7}}), "not a configuration"),
    (
        "constraint divides by zero",
        "entry",
        general({"codename": GEMM, "defines": {"MDIMC": 0, "NDIMC": 0}}),
        "not a configuration the library",
    ),
    (
        "defines of another kernel",
        "entry",
        general({"codename": "crossv", "defines": {"MWG": 64}}),
        "not a configuration the library",
    ),
    ("shapes a list", "entry", {"shapes": [GOOD]}, "ignoring the tuned winners by shape: 'shapes' is a list"),
    ("shape key not MxKxN", "entry", {"shapes": {"150x640": GOOD}}, "'150x640' is not a product MxKxN"),
    ("shape key zero", "entry", {"shapes": {"0x640x32": GOOD}}, "'0x640x32' is not a product MxKxN"),
    ("shape winner a number", "entry", {"shapes": {"150x640x32": 3}}, "expected an object, got a number"),
    (
        "shape winner outside its preconditions",
        "entry",
        {"shapes": {"150x640x1": {"codename": GEMM, "defines": {}}}},
        "preconditions do not hold for 150x640x1",
    ),
]


@pytest.mark.parametrize("name, where, contents, why", DAMAGED, ids=[d[0] for d in DAMAGED])
def test_a_damaged_database_is_ignored_with_a_warning_and_predict_is_right(
    device, cache, rng, name, where, contents, why
):
    key = device_key(device)
    path = cache / "tuning.json"
    if where == "file":
        path.write_text(contents if isinstance(contents, str) else json.dumps(contents))
    else:
        path.write_text(json.dumps(database(device, contents) if where == "entry" else {key: contents}))
    model = malinn.Sequential([Dense(150, activation="relu")])
    model.build((None, 640))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.05 for w in model.get_weights()])
    x = rng.random((32, 640), dtype=np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = model.predict(x)
        y1 = model.predict(x[:1])
        assert tuning_db.tuned_choice(device) is None and tuning_db.tuned_choice(device, (150, 640, 1)) is None
    w, b = model.get_weights()
    assert_close(y, np.maximum(x.astype(np.float64) @ w + b, 0))
    assert_close(y1, np.maximum(x[:1].astype(np.float64) @ w + b, 0))
    messages = [str(c.message) for c in caught if "malinn:" in str(c.message)]
    assert len(messages) == 1, messages  # one line, once per process
    assert why in messages[0] and str(path) in messages[0] and "\n" not in messages[0]
    if where != "file":  # an entry's damage names the device key
        assert repr(key) in messages[0]


def test_one_bad_entry_leaves_the_good_ones_in_use(device, cache):
    (cache / "tuning.json").write_text(
        json.dumps(
            database(
                device,
                {
                    "general": {"codename": "crossv", "defines": {}},
                    "shapes": {"150x640x32": {"codename": "relu"}, "150x640x40": {"codename": "rmcm", "defines": {}}},
                },
            )
        )
    )
    with pytest.warns(RuntimeWarning, match="'relu' is not a matmul kernel"):
        assert ops.kernel_for("matmul", device, (150, 640, 32)).codename == "crossv"
    assert ops.kernel_for("matmul", device, (150, 640, 40)).codename == "rmcm"


def test_cli_tune_quick_with_a_shape(tmp_path):
    env = {**os.environ, "MALINN_CACHE_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "malinn.cli", "tune", "--quick", "--shape", "20x30x40", "--budget", "60"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert "best: " in out.stdout and (tmp_path / "tuning.json").is_file()
    assert "ETA " in out.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "malinn.cli", "tune", "--shape", "20x30"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "argument --shape: expected MxKxN" in bad.stderr


def test_cli_tune_without_a_shape_or_model_stores_a_general_winner(tmp_path):
    """The standard set of shapes, as README and ``tune --help`` say (from f225fb0 until now the
    command timed nothing, said nothing and exited 0)."""
    env = {**os.environ, "MALINN_CACHE_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "malinn.cli", "tune", "--quick", "--budget", "5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    assert re.search(r"best: \S+ .* over \d+ shapes, \d+ candidates timed", out.stdout), out.stdout
    (entry,) = json.loads((tmp_path / "tuning.json").read_text())["devices"].values()
    assert entry["general"]["codename"] in out.stdout


def test_cli_tune_model_tunes_each_dense_shape_at_the_batch_and_at_1(tmp_path):
    model = os.path.join(malinn.__path__[0], "..", "examples", "digits_mlp.keras")
    env = {**os.environ, "MALINN_CACHE_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "malinn.cli", "tune", "--quick", "--model", model, "--batch", "20"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    stored = json.loads((tmp_path / "tuning.json").read_text())["devices"]
    (entry,) = stored.values()
    # the plan runs a pass of 20 samples as batch_bucket(20) columns, and asks for exactly that shape
    want = {f"{m}x{k}x{n}" for m, k in [(32, 64), (16, 32), (10, 16)] for n in (batch_bucket(20), 1)}
    assert set(entry["shapes"]) == want and "general" not in entry
    assert all(f"{shape}: " in out.stdout for shape in want)


def test_a_per_shape_run_times_each_shapes_untuned_choice_first(device, cache):
    """At batch 1 the runtime runs a fallback (a gemv), not the kind's default: a --model run cut
    short by its budget timed cross1 and crossv first and stored crossv, 5x slower than the gemv
    (benchmarks/tune_networks.py). Each shape's untuned choice is timed first now."""
    from malinn.choice.kernel_choice import untuned_matmul

    for shape in [(150, 640, 1), (64, 50, 20)]:  # a budget of 0: one candidate timed
        best = tuner.tune(
            device, shapes=[shape], quick=True, repeat=1, budget_s=0, stream=io.StringIO(), per_shape=True
        )
        spec = untuned_matmul(device, shape)
        won = best["shapes"][tuner.shape_key(shape)]
        assert (won["codename"], won["defines"]) == (spec.codename, spec.config)
    # several shapes and a budget of 0: every shape's untuned choice timed still (as `tune --budget`
    # says; the first shape's alone was, the others were left untuned)
    shapes = [(150, 640, 1), (64, 50, 20), (10, 150, 1)]
    best = tuner.tune(device, shapes=shapes, quick=True, repeat=1, budget_s=0, stream=io.StringIO(), per_shape=True)
    assert best["untuned"] == [] and len(best["shapes"]) == 3
    for shape in shapes:
        spec, won = untuned_matmul(device, shape), best["shapes"][tuner.shape_key(shape)]
        assert (won["codename"], won["defines"]) == (spec.codename, spec.config), shape


def test_the_device_kinds_default_is_timed_first(device):
    """A run cut short by its budget has timed the untuned choice (before, the naive kernels came
    first, and a 1-second budget stored cross1 as the device's winner)."""
    library = malinn.load_library()
    default = library.default_spec("matmul", device.kind, device.backend)
    for quick in (True, False):
        assert tuner._candidates(library, device, quick=quick, seed=0)[0] == (default.codename, default.config)


@pytest.mark.parametrize("stored_gflops, kept", [(1e9, True), (1e-9, False)], ids=["faster", "slower"])
def test_a_run_cut_short_replaces_no_faster_stored_winner(device, cache, stored_gflops, kept):
    shapes = [(13, 37, 33)]
    before = {"codename": "crossv", "defines": {}, "gflops": stored_gflops, "shapes": [list(s) for s in shapes]}
    shaped = {"codename": "crossv", "defines": {}, "gflops": stored_gflops, "seconds": 1.0}
    (cache / "tuning.json").write_text(
        json.dumps(database(device, {"general": before, "shapes": {"13x37x33": shaped}}))
    )
    for per_shape in (False, True):
        best = tuner.tune(
            device, shapes=shapes, quick=True, repeat=1, budget_s=0, stream=io.StringIO(), per_shape=per_shape
        )
        assert best["candidates"] == 1
        entry = json.loads((cache / "tuning.json").read_text())["devices"][device_key(device)]
        got = entry["shapes"]["13x37x33"] if per_shape else entry["general"]
        assert (got["gflops"] == stored_gflops) == kept and (got["codename"] == "crossv") == kept
        said = best["kept"] == ["13x37x33"] if per_shape else bool(best.get("kept"))
        assert said == kept


def test_a_run_cut_short_keeps_no_stored_winner_the_library_no_longer_offers(device, cache):
    """A faster stored winner whose kernel left the library (or whose preconditions no longer hold
    for the shape) is replaced, not kept: every later process ignored it with a warning."""
    shapes = [(13, 37, 33)]
    gone = {"codename": "no_such_kernel", "defines": {}, "gflops": 1e9, "shapes": [list(s) for s in shapes]}
    (cache / "tuning.json").write_text(
        json.dumps(database(device, {"general": gone, "shapes": {"13x37x33": {**gone, "seconds": 1e-9}}}))
    )
    for per_shape in (False, True):
        best = tuner.tune(
            device, shapes=shapes, quick=True, repeat=1, budget_s=0, stream=io.StringIO(), per_shape=per_shape
        )
        entry = json.loads((cache / "tuning.json").read_text())["devices"][device_key(device)]
        got = entry["shapes"]["13x37x33"] if per_shape else entry["general"]
        assert got["codename"] != "no_such_kernel" and not (best["kept"] if per_shape else best.get("kept"))


def test_tune_names_the_candidates_that_failed_or_ran_wrong(device, cache, monkeypatch, capsys):
    """A candidate that does not build or gives numbers numpy does not was dropped without a word:
    for a kernel developer adding candidates, the tuner is the only check they get."""
    from malinn.cli import commands as cli

    timed = tuner._time_product

    def faulty(spec, device, shape, repeat):
        if spec.codename == "cross1":
            raise malinn.MalinnError("cross1 did not build\nthe log")
        return None if spec.codename == "crossv" else timed(spec, device, shape, repeat)

    monkeypatch.setattr(tuner, "_time_product", faulty)
    assert cli.main(["tune", "--quick", "--shape", "13x7x5"]) == 0
    out = capsys.readouterr().out
    assert "failed: cross1: cross1 did not build\n" in out
    assert "failed: crossv: a result that numpy does not give" in out


def test_two_processes_storing_winners_at_once_lose_none(tmp_path):
    """Each process stores 60 shape winners of its own device, one at a time, while the other does:
    the database holds all 120 (the file is read, merged and written under a lock)."""
    script = """
import sys, types
from malinn.choice import tuning_db
device = types.SimpleNamespace(identity="test|" + sys.argv[1])
for i in range(60):
    tuning_db.save(device, shapes={f"{i + 1}x1x1": {"codename": "crossv", "defines": {}, "seconds": 1.0}})
"""
    env = {**os.environ, "MALINN_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", script, name], env=env) for name in ("a", "b")]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    devices = json.loads((tmp_path / "tuning.json").read_text())["devices"]
    assert {name: len(devices[f"test|{name}"]["shapes"]) for name in "ab"} == {"a": 60, "b": 60}


def test_tune_refuses_a_precision_the_device_cannot_run_before_timing(device, cache):
    if "cl_khr_fp16" in getattr(device, "extensions", ()):
        pytest.skip(f"{device.name} computes in half")
    progress = io.StringIO()
    with pytest.raises(MalinnError, match="fp16"):
        tuner.tune(device, shapes=[(13, 37, 33)], quick=True, repeat=1, stream=progress, precision="fp16")
    assert progress.getvalue() == "" and not (cache / "tuning.json").exists()


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_to_a_log_is_a_line_at_each_quarter():
    """Not a terminal: no carriage returns (a log filled with them), four lines for 100 steps."""
    stream = io.StringIO()
    started = tuner.time.perf_counter()
    for done in range(101):
        tuner._progress(done, 100, "gemm_tiled", stream, started)
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue() and [line.split()[1] for line in lines] == [
        "25/100",
        "50/100",
        "75/100",
        "100/100",
    ]
    assert all(len(line) < 80 for line in lines)


@pytest.mark.parametrize("columns", [40, 80, 200])
def test_the_progress_line_fits_the_terminal_and_its_eta_the_budget(monkeypatch, columns):
    monkeypatch.setattr(tuner.shutil, "get_terminal_size", lambda fallback=None: os.terminal_size((columns, 24)))
    stream = _Terminal()
    started = tuner.time.perf_counter() - 10  # 10 s in, 1 of 100 done: 990 s to go, but 5 s of budget left
    tuner._progress(1, 100, "gemm_tiled " + "MWG=64 " * 30, stream, started, budget_s=15)
    line = stream.getvalue()
    assert line.startswith("\r") and len(line) - 1 < columns and "ETA 5 s" in line
