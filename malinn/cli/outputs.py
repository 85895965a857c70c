"""What the commands read and print: input files for a model, predictions in the output's format, reports."""

from __future__ import annotations

import io
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..errors import MalinnError
from ..io.array_files import read_input_array
from ..io.streams import STREAM
from ..plan.tensor import format_shape
from .arguments import UsageError


def _is_stdout(path: str | os.PathLike) -> bool:
    """Whether ``path`` is the file this process's stdout writes to."""
    try:
        a, b = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def report_stream(output):
    """Where a command's one-line report goes: stdout, unless the data itself goes there."""
    return sys.stderr if output is None or output == STREAM or _is_stdout(output) else sys.stdout


def report(text: str, stream: IO[str] | None, written: object) -> None:
    """Prints a command's one-line report once its output ``written`` is safely written: a stream
    that cannot take it (stdout on a full disk, ``> /dev/full``) is an error (exit 1) that says the
    output was written all the same."""
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError:
        raise
    except OSError as exc:
        if stream is sys.stdout:
            drop_stdout()  # what stays in its buffer would fail again at exit
        raise MalinnError(
            f"{written} is written, but its report could not be written to "
            f"{'stdout' if stream is sys.stdout else 'stderr'} ({exc.strerror or exc})"
        ) from None


def shown(model: str, weights: str | None) -> str:
    """The model as the user named it: ``m.keras``, or ``m.json + w.h5`` for a split form."""
    return str(model) if weights is None else f"{model} + {weights}"


def output_format(path: str | None, outputs: int) -> str:
    """``npy``, ``npz`` or ``csv``: how predict writes to ``path`` (None: stdout) the predictions of a
    model of ``outputs`` outputs: by the file's suffix, else (stdout, an existing device or FIFO such
    as ``/dev/null``, a name without one) ``.npy`` for one output and ``.npz`` for several.

    Raises:
        UsageError: another suffix, or ``.npy`` / ``.csv`` for a model of several outputs.
    """
    suffix = Path(str(path)).suffix.lower() if path is not None and not special_file(path) else ""
    if suffix not in ("", ".npy", ".npz", ".csv"):
        raise UsageError(f"{path}: predict writes .npy, .npz or .csv files; give one of those suffixes")
    if outputs > 1 and suffix in (".npy", ".csv"):
        raise UsageError(f"{path}: the model has {outputs} outputs; give a .npz file (one array per output)")
    return suffix[1:] if suffix else ("npz" if outputs > 1 else "npy")


def special_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an existing file that is not a regular one (a device, a FIFO, /dev/stdout)."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def save_predictions(y: np.ndarray | dict, form: str, name: str = "output") -> Callable[[IO[bytes]], None]:
    """A writer of ``y`` (one array, or several outputs as a dict by name) in ``form``: ``npy``,
    ``npz`` (one output named ``name``), or ``csv`` (one row per sample, its values flattened)."""
    if form == "npz":
        return lambda f: np.savez(f, **(y if isinstance(y, dict) else {name: y}))
    array = np.asarray(y)  # one output: the array itself
    if form == "csv":
        return lambda f: np.savetxt(f, array.reshape(array.shape[0], -1), fmt="%.9g", delimiter=",")
    return lambda f: np.save(f, array)


def inputs_text(model: Any) -> str:
    """``(None, 8)`` or ``x (None, 8), t (None, 3)`` for a model of several inputs."""
    shapes = [format_shape((None,) + tuple(s)) for s in model.input_shapes]
    return shapes[0] if len(shapes) == 1 else ", ".join(f"{n} {s}" for n, s in zip(model.input_names, shapes))


def read_inputs(model, path, key):
    """The model's input(s) from ``path``: one array, or for a model of several inputs a dict of the
    ``.npz`` arrays named after its inputs."""
    shapes = model.input_shapes
    if len(shapes) == 1:
        return read_input_array(path, key=key, sample_shape=shapes[0])
    if key is not None:
        raise UsageError(
            f"--key chooses one array, but the model takes {len(shapes)} inputs: give a .npz holding "
            f"arrays named {', '.join(model.input_names)}"
        )
    if Path(path).suffix.lower() != ".npz":
        raise MalinnError(
            f"{path}: the model takes {len(shapes)} inputs; give a .npz holding arrays named "
            f"{', '.join(model.input_names)}"
        )
    return {
        name: read_input_array(path, key=name, sample_shape=shape) for name, shape in zip(model.input_names, shapes)
    }


def named_outputs(model, y):
    """One output as it is; several as a dict by the name of the layer computing each, a layer
    called for several outputs (a shared head) numbered as Keras numbers names: ``dense``,
    ``dense_1``, ..."""
    if isinstance(y, np.ndarray):
        return y
    if isinstance(y, dict):
        return y
    names = []
    for t in model.outputs:
        name, i = t.name, 0
        while name in names:
            i += 1
            name = f"{t.name}_{i}"
        names.append(name)
    return dict(zip(names, y))


def shape_text(value: np.ndarray | dict) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v.shape}" for k, v in value.items())
    return str(value.shape)


def print_table(y: np.ndarray) -> None:
    rows = y.reshape(y.shape[0], -1)
    print(f"{'sample':>6} " + " ".join(f"{f'y[{j}]':>11}" for j in range(rows.shape[1])))
    for i, row in enumerate(rows):
        print(f"{i:>6} " + " ".join(f"{v:>11.5g}" for v in row))


def count_text(n: int, noun: str) -> str:
    """``1 plan``, ``2 plans``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def drop_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so that Python's exit flush stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass
