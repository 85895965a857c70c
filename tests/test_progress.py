"""malinn/plan/progress.py: a plan's program builds reported on stderr (a line updated on a terminal, a
summary elsewhere), nothing where nothing is built, nothing with MALINN_PROGRESS=0."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from support import python_env, run_on_terminal

import malinn
from malinn.layers import Dense
from malinn.plan import progress

DIGITS = Path(__file__).resolve().parents[1] / "examples" / "digits_mlp.keras"


def cold(device, monkeypatch):
    """``device`` with empty program memos for this test (a new process's, the binary cache being off
    in the test run: every program is built again); the run's memos are put back after."""
    monkeypatch.setitem(device.cache, "kernel_programs", {})
    monkeypatch.setitem(device.cache, "programs", {})
    return device


def model(name: str) -> malinn.Sequential:
    m = malinn.Sequential([Dense(24, activation="relu"), Dense(5, activation="softmax")], name=name)
    m.build((None, 12))
    return m


def test_a_plan_that_builds_ends_with_one_summary_line_off_a_terminal(device, monkeypatch, capsys):
    monkeypatch.setattr(progress, "MIN_SECONDS", 0.0)  # a second or more, in a real network's case
    cold(device, monkeypatch)
    capsys.readouterr()
    before = device.counters["builds"]
    model("first").predict(np.ones((3, 12), np.float32))
    built = device.counters["builds"] - before
    err = capsys.readouterr().err
    assert built > 0
    assert re.fullmatch(
        rf"malinn: built {built} kernel programs? for 'first' on {re.escape(device.name)} in "
        rf"\d+\.\d s\n",
        err,
    ), err
    model("second").predict(np.ones((3, 12), np.float32))  # the same programs, from the device's memory
    assert capsys.readouterr().err == ""


def test_builds_that_take_less_than_a_second_say_nothing_off_a_terminal(device, monkeypatch, capsys):
    monkeypatch.setattr(progress, "MIN_SECONDS", 3600.0)
    cold(device, monkeypatch)
    capsys.readouterr()
    before = device.counters["builds"]
    model("quick").predict(np.ones((3, 12), np.float32))
    assert device.counters["builds"] > before and capsys.readouterr().err == ""


@pytest.mark.parametrize("value", ["0", "off", " False "])
def test_malinn_progress_off_says_nothing(device, monkeypatch, capsys, value):
    monkeypatch.setattr(progress, "MIN_SECONDS", 0.0)
    monkeypatch.setenv("MALINN_PROGRESS", value)
    cold(device, monkeypatch)
    capsys.readouterr()
    before = device.counters["builds"]
    model("silent").predict(np.ones((3, 12), np.float32))
    assert device.counters["builds"] > before and capsys.readouterr().err == ""


def test_a_terminal_shows_one_line_updated_in_place_then_the_summary(tmp_path):
    """A new process with an empty cache, its stderr a terminal: ``\\r``-updated counts of the plan's
    launches, ending at the total, then the summary and a newline; a second process, whose programs
    are all in the binary cache, prints nothing."""
    script = (
        "import sys, numpy as np, malinn\n"
        "m = malinn.load_model(sys.argv[1])\n"
        "d = malinn.get_device()\n"
        "m.predict(np.zeros((1, 64), np.float32))\n"
        "print(d.counters['builds'], d.counters['binary_hits'], d.name, m.name)\n"
    )
    env = python_env(MALINN_CACHE_DIR=str(tmp_path / "cache"), MALINN_BINARY_CACHE="1", MALINN_GL="0")
    env.pop("MALINN_PROGRESS", None)
    status, out, terminal = run_on_terminal([sys.executable, "-c", script, str(DIGITS)], env)
    assert status == 0, terminal
    builds, hits, rest = out.split(" ", 2)
    device_name, name = rest.strip().rsplit(" ", 1)
    assert int(builds) > 0 and int(hits) == 0, out
    lines = terminal.split("\r")
    counts = [
        re.fullmatch(rf"malinn: building kernels for '{name}' on {re.escape(device_name)}: (\d+)/(\d+) *", line)
        for line in lines[1:-1]
    ]
    assert lines[0] == "" and counts and all(counts), terminal
    steps = [int(c.group(1)) for c in counts]
    assert steps == sorted(steps) and steps[-1] == int(counts[-1].group(2)), terminal  # it ends at the total
    assert re.fullmatch(
        rf"malinn: built {builds} kernel programs? for '{name}' on {re.escape(device_name)} in "
        rf"\d+\.\d s *\n",
        lines[-1],
    ), terminal
    status, out, terminal = run_on_terminal([sys.executable, "-c", script, str(DIGITS)], env)
    assert status == 0 and out.split()[:2] == ["0", builds] and terminal == "", (out, terminal)


def test_a_bad_value_of_malinn_progress_is_refused_by_name(device, monkeypatch):
    """Read when a plan is made (and by every device discovery: tests/test_environment.py)."""
    monkeypatch.setenv("MALINN_PROGRESS", "quiet")
    with pytest.raises(malinn.SettingError, match="MALINN_PROGRESS='quiet': expected 1 or 0"):
        model("bad").predict(np.ones((3, 12), np.float32))
