"""``malinn warm`` (malinn/cli/commands.py): the programs a model needs built into the program cache at install
time, so that a later process's first predict builds nothing and says nothing."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import python_env, run_on_terminal

from malinn.cli import commands as cli

DIGITS = Path(__file__).resolve().parents[1] / "examples" / "digits_mlp.keras"


def warm_env(tmp_path) -> dict:
    """A process of its own on the default OpenCL device, with an empty cache that keeps binaries."""
    return python_env(MALINN_CACHE_DIR=str(tmp_path / "cache"), MALINN_BINARY_CACHE="1", MALINN_GL="0")


def warm(env, *args):
    return subprocess.run(
        [sys.executable, "-m", "malinn", "warm", *map(str, args)], capture_output=True, text=True, timeout=300, env=env
    )


def test_warm_fills_the_cache_so_that_the_next_first_predict_builds_nothing(tmp_path):
    env = warm_env(tmp_path)
    out = warm(env, DIGITS)
    assert out.returncode == 0, out.stderr
    first, total = out.stdout.splitlines()
    found = re.fullmatch(
        rf"{re.escape(str(DIGITS))} at batch 1: (\d+) kernel programs? built, 0 loaded from the "
        rf"program cache \(\d+\.\d s\)",
        first,
    )
    assert found and int(found.group(1)) > 0, out.stdout
    built = int(found.group(1))
    assert total.startswith("warm on ") and f": 1 plan of 1 model, {found.group(1)} kernel program" in total, total
    # the service's first predict, its stderr a terminal (where a build would show at once)
    script = (
        "import sys, numpy as np, malinn\n"
        "y = malinn.load_model(sys.argv[1]).predict(np.zeros((1, 64), np.float32))\n"
        "d = malinn.get_device()\n"
        "print(y.shape, d.counters['builds'], d.counters['binary_hits'])\n"
    )
    status, printed, terminal = run_on_terminal([sys.executable, "-c", script, str(DIGITS)], env)
    assert status == 0, terminal
    assert printed.split() == ["(1,", "10)", "0", str(built)] and terminal == "", (printed, terminal)
    # more batch sizes: one above 256 planned for its bucket (the next multiple of 64) as predict plans
    # it, a size given twice planned once, batch 1's programs all in the cache now
    again = warm(env, DIGITS, "--batch", "300", "--batch", "1", "--batch", "300")
    assert again.returncode == 0, again.stderr
    lines = again.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:-1]] == [
        f"{DIGITS} at batch 300 (planned as 320)",
        f"{DIGITS} at batch 1",
    ], again.stdout
    assert re.fullmatch(
        rf"{re.escape(str(DIGITS))} at batch 1: 0 kernel programs built, \d+ loaded from the program "
        rf"cache \(\d+\.\d s\)",
        lines[1],
    ), lines[1]  # some were, for batch 300, just before
    assert int(lines[0].split(": ")[1].split()[0]) > 0, lines[0]  # batch 320's kernels differ from batch 1's
    assert ": 2 plans of 1 model, " in lines[-1], again.stdout


def test_warm_refuses_where_nothing_would_be_kept(monkeypatch, capsys):
    monkeypatch.setenv("MALINN_BINARY_CACHE", "0")
    assert cli.main(["warm", str(DIGITS)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("malinn: error: MALINN_BINARY_CACHE=0 turns the program cache off") and "unset it" in err


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "the following arguments are required: model"),
        ([str(DIGITS), "--batch", "0"], "argument --batch: expected a positive integer, got '0'"),
    ],
)
def test_warm_usage_errors_exit_2(args, message, capsys):
    assert cli.main(["warm", *args]) == 2
    assert message in capsys.readouterr().err
