"""The ``malinn`` command (also ``python3 -m malinn``): convert, predict, verify, summary, tune, warm, devices.

Exit codes: 0 success, 1 a malinn error (bad model or input file, device failure, verify
mismatch), 2 a usage error (bad arguments), 130 interrupted. Every error is one line on stderr,
``malinn: error: ...``; no traceback is ever printed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from ..backends.base import size_text
from ..backends.selection import devices, get_device, set_device
from ..choice.kernel_choice import check_precision
from ..environment import switch
from ..errors import DeviceError, MalinnError
from ..io.array_files import read_input_array
from ..io.files import check_destination, write_file, write_stdout
from ..io.streams import STREAM, copy_to_stdout, stdin_as_file
from ..library.kernel_library import DEFAULT_PRECISION
from ..library.precision import flushed
from ..model.model import batch_bucket
from ..model.saving import is_malinn_file, load_model, resolve_target, save_model
from ..plan.progress import reported_by_caller
from ..plan.tensor import format_shape
from ..tuning.conv_tuner import tune_convs
from ..tuning.tuner import cache_dir, tune
from ..version import __version__
from .serve_command import add_serve_command
from .streaming import npy_layout, stream_predict

#: the weight precisions (kernels/library.json's "precisions")
PRECISIONS = ("fp32", "fp16-storage", "fp16", "int8-weights")


#: verify's default tolerance (largest rel error) per precision: a little above the worst layer of
#: the test zoo and the digits example measured in that precision (docs/CONVERTING.md)
VERIFY_TOLERANCE = {"fp32": 1e-5, "fp16-storage": 1e-2, "fp16": 2e-2, "int8-weights": 1e-1}
#: the least default tolerance where Keras itself computed in a reduced precision (a mixed_float16
#: or mixed_bfloat16 policy, a float16 or bfloat16 layer; an int8-quantized layer, whose inputs
#: Keras rounds to int8 too): malinn computes such layers in float32 (with the int8 weights)
KERAS_REDUCED_TOLERANCE = {"float16": 1e-2, "bfloat16": 5e-2, "int8": 5e-2}
#: the size of a source (its files together) from which convert says, before each phase, what it does: reading
#: and converting, then laying out and writing, take about a second each per 40 MB on a 2-core CPU
CONVERT_ANNOUNCED_BYTES = 64 * 2**20
PRECISION_HELP = ("the weights' precision on the device: fp32, fp16-storage (half weights, float "
                  "arithmetic), fp16 (half arithmetic: devices with cl_khr_fp16) or int8-weights (per-output-channel "
                  "int8 with float scales)")


class UsageError(MalinnError):
    """A command line that cannot be run as given (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (the usage is in ``--help``)."""

    def error(self, message):
        command = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        raise UsageError(f"{command}{message} (see {self.prog} --help)")


# ------------------------------------------------------------------ argument types
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _finite_float(text: str, smallest_ok, expected: str) -> float:
    """``text`` as a finite float that ``smallest_ok`` accepts, else the argparse error ``expected``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and smallest_ok(value)):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    return _finite_float(text, lambda v: v > 0, "a positive number of seconds")


def _tolerance(text: str) -> float:
    return _finite_float(text, lambda v: v >= 0, "a number >= 0")


def _product_shape(text: str) -> tuple:
    try:
        shape = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"expected MxKxN with three positive integers, got {text!r}")
    return shape


# ------------------------------------------------------------------ helpers
def _device(args):

    if getattr(args, "device", None) is not None:   # --device "" is refused by name, not ignored
        set_device(args.device)
    return get_device()


def _is_stdout(path) -> bool:
    """Whether ``path`` is the file this process's stdout writes to."""
    try:
        a, b = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _report_stream(output):
    """Where a command's one-line report goes: stdout, unless the data itself goes there."""
    return sys.stderr if output is None or output == STREAM or _is_stdout(output) else sys.stdout


def _report(text: str, stream, written) -> None:
    """Prints a command's one-line report once its output ``written`` is safely written: a stream
    that cannot take it (stdout on a full disk, ``> /dev/full``) is an error (exit 1) that says the
    output was written all the same."""
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError:
        raise
    except OSError as exc:
        if stream is sys.stdout:
            _drop_stdout()   # what stays in its buffer would fail again at exit
        raise MalinnError(f"{written} is written, but its report could not be written to "
                          f"{'stdout' if stream is sys.stdout else 'stderr'} ({exc.strerror or exc})") from None


def _shown(model, weights) -> str:
    """The model as the user named it: ``m.keras``, or ``m.json + w.h5`` for a split form."""
    return str(model) if weights is None else f"{model} + {weights}"


def _output_format(path, outputs: int) -> str:
    """``npy``, ``npz`` or ``csv``: how predict writes to ``path`` (None: stdout) the predictions of a
    model of ``outputs`` outputs: by the file's suffix, else (stdout, an existing device or FIFO such
    as ``/dev/null``, a name without one) ``.npy`` for one output and ``.npz`` for several.

    Raises:
        UsageError: another suffix, or ``.npy`` / ``.csv`` for a model of several outputs.
    """
    suffix = Path(str(path)).suffix.lower() if path is not None and not _special_file(path) else ""
    if suffix not in ("", ".npy", ".npz", ".csv"):
        raise UsageError(f"{path}: predict writes .npy, .npz or .csv files; give one of those suffixes")
    if outputs > 1 and suffix in (".npy", ".csv"):
        raise UsageError(f"{path}: the model has {outputs} outputs; give a .npz file (one array per output)")
    return suffix[1:] if suffix else ("npz" if outputs > 1 else "npy")


def _special_file(path) -> bool:
    """Whether ``path`` is an existing file that is not a regular one (a device, a FIFO, /dev/stdout)."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _save_predictions(y, form: str, name: str = "output"):
    """A writer of ``y`` (one array, or several outputs as a dict by name) in ``form``: ``npy``,
    ``npz`` (one output named ``name``), or ``csv`` (one row per sample, its values flattened)."""
    if form == "npz":
        return lambda f: np.savez(f, **(y if isinstance(y, dict) else {name: y}))
    if form == "csv":
        return lambda f: np.savetxt(f, y.reshape(y.shape[0], -1), fmt="%.9g", delimiter=",")
    return lambda f: np.save(f, y)


def _inputs_text(model) -> str:
    """``(None, 8)`` or ``x (None, 8), t (None, 3)`` for a model of several inputs."""
    shapes = [format_shape((None,) + tuple(s)) for s in model.input_shapes]
    names = getattr(model, "input_names", None)
    return shapes[0] if len(shapes) == 1 else ", ".join(f"{n} {s}" for n, s in zip(names, shapes))


def _read_inputs(model, path, key):
    """The model's input(s) from ``path``: one array, or for a model of several inputs a dict of the
    ``.npz`` arrays named after its inputs."""
    shapes = model.input_shapes
    if len(shapes) == 1:
        return read_input_array(path, key=key, sample_shape=shapes[0])
    if key is not None:
        raise UsageError(f"--key chooses one array, but the model takes {len(shapes)} inputs: give a .npz holding "
                         f"arrays named {', '.join(model.input_names)}")
    if Path(path).suffix.lower() != ".npz":
        raise MalinnError(f"{path}: the model takes {len(shapes)} inputs; give a .npz holding arrays named "
                          f"{', '.join(model.input_names)}")
    return {name: read_input_array(path, key=name, sample_shape=shape) for name, shape in zip(model.input_names, shapes)}


def _named_outputs(model, y):
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


def _shape_text(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v.shape}" for k, v in value.items())
    return str(value.shape)


# ------------------------------------------------------------------ commands
def cmd_devices(args) -> int:

    os.environ.setdefault("MALINN_GL", "1")   # list the OpenGL devices too, even beside an OpenCL GPU
    found = devices()
    if not found:
        raise MalinnError("no working OpenCL or OpenGL device (install a driver, e.g. apt-get install "
                          "pocl-opencl-icd, or libegl-mesa0 and pip install malinn[gl])")
    try:
        current = get_device()
    except DeviceError:
        current = None
        setting = os.environ.get("MALINN_DEVICE", "")
        print(f"malinn: warning: MALINN_DEVICE={setting!r} matches none of these devices; no device is marked "
              "and other commands fail until it names one (gpu, cpu, P:D, gl or part of a name)", file=sys.stderr)
    for d in found:
        print(("* " if d is current else "  ") + str(d))
    return 0


def _default_output(src: str) -> str:
    """``model.keras`` -> ``model.malinn`` (beside it); a folder (an unzipped .keras) -> ``folder.malinn``
    beside the folder (``.`` is the working directory, named).

    Raises:
        UsageError: the source has no name to take (``/``).
    """
    path = Path(src)
    if path.is_dir():
        path = path.resolve()
        if not path.name:
            raise UsageError(f"convert: {src} has no name to give the output; give one (-o OUTPUT)")
        return str(path.with_name(path.name + ".malinn"))
    return str(path.with_name(path.stem + ".malinn") if path.suffix else path.with_name(path.name + ".malinn"))


def _source_bytes(*paths) -> int:
    """The bytes of the files ``paths`` name (a folder's: the files in it; None or a missing path: 0)."""
    total = 0
    for path in paths:
        if path is None:
            continue
        try:
            if os.path.isdir(path):
                total += sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(path)
                             for name in names)
            else:
                total += os.path.getsize(path)
        except OSError:
            continue
    return total


def cmd_convert(args) -> int:
    if args.dest is not None and args.output is not None and args.dest != args.output:
        raise UsageError(f"convert: two outputs, {args.dest} and -o {args.output}; give one "
                         "(see malinn convert --help)")
    if args.output is None:   # an empty -o "" is refused below, not replaced
        if args.dest is None and getattr(args, "from_stdin", None) == "src":
            raise UsageError("convert: the source is standard input (-), which has no name to give the output; "
                             "give one (-o OUTPUT, or -o - for standard output)")
        args.output = args.dest if args.dest is not None else _default_output(args.src)
    to_stdout = args.output == STREAM
    if to_stdout and (sys.stdout is None or sys.stdout.isatty()):
        raise UsageError(f"convert: -o - writes the model file's bytes to standard output, which is "
                         f"{'closed' if sys.stdout is None else 'a terminal'}; redirect it (> model.malinn) or give "
                         "-o FILE")
    if not to_stdout:
        check_destination(args.output, source=(args.src, args.weights), overwrite_source=args.force)
    device = None
    if args.device is not None or args.target is None:
        device = _device(args)    # the target comes from the device; an explicit --target needs none
    resolve_target(args.target)   # an unknown target fails before the model is read
    size = _source_bytes(args.src, args.weights)
    announce = size >= CONVERT_ANNOUNCED_BYTES   # each phase then takes seconds: say which one runs
    if announce:
        print(f"malinn convert: reading {_shown(args.src, args.weights)} ({size_text(size)})...", file=sys.stderr,
              flush=True)
    model = load_model(args.src, weights=args.weights)
    recorded = model.precision if is_malinn_file(args.src) else None
    if args.precision is not None:
        model.precision = args.precision
    if announce:
        print(f"malinn convert: laying out the weights of {len(model.layers)} layers in {model.precision} and writing "
              f"{args.output}...", file=sys.stderr, flush=True)
    if to_stdout:   # HDF5 writes with seeks: a file first, then its bytes
        with tempfile.TemporaryDirectory(prefix="malinn-stdout-") as folder:
            copy_to_stdout(save_model(model, os.path.join(folder, "model.malinn"), target=args.target))
        path = "stdout"
    else:
        path = save_model(model, args.output, target=args.target, overwrite=args.force)
    spec = resolve_target(args.target, model.precision)
    _report(f"{_shown(args.src, args.weights)} -> {path}: {len(model.layers)} layers, {model.count_params()} "
            f"parameters, input {_inputs_text(model)}, weights laid out for {spec.codename} in {model.precision}",
            _report_stream(args.output), path)
    if recorded not in (None, DEFAULT_PRECISION, model.precision):
        print(f"malinn: note: {args.src} holds weights rounded to {recorded}; {path} keeps those rounded "
              f"values in {model.precision} (convert the Keras file for its own float32 weights)", file=sys.stderr)
    lost = {f"{layer.name} {name}": count for layer in model.layers
            for name, matrix in layer.precision_weights().items() if (count := flushed(matrix, model.precision))}
    if lost:   # never lower precision without saying what it cost
        print(f"malinn: note: {sum(lost.values())} non-zero weights are below {model.precision}'s smallest value "
              f"(about 6e-8) and are stored as 0 ({', '.join(f'{k}: {v}' for k, v in lost.items())}); "
              f"malinn verify --precision {model.precision} shows what that costs", file=sys.stderr)
    if device is not None:
        try:   # the file may be meant for a board that runs it: written, with a note
            check_precision(model.precision, device)
        except MalinnError as error:
            print(f"malinn: note: {path} is written, but this device cannot run it: {error}", file=sys.stderr)
    return 0


def cmd_predict(args) -> int:

    if args.output == STREAM:   # stdout, as without -o
        args.output = None
    if args.output is not None:
        check_destination(args.output, source=(args.model, args.weights), overwrite_source=args.force)
        check_destination(args.output, source=args.input, overwrite_source=args.force)
        _output_format(args.output, 1)   # a suffix predict cannot write fails before any work
    elif sys.stdout is None:
        raise MalinnError("stdout is closed: give the output file with -o")
    pool = None
    if args.device is not None and "," in args.device:   # several devices: each chunk's passes spread over them
        pool = set_device([spec.strip() for spec in args.device.split(",")])
        device = pool[0]
    else:
        device = _device(args)
    model = load_model(args.model, weights=args.weights, precision=args.precision)
    outputs = getattr(model, "outputs", None) or [None]
    form = _output_format(args.output, len(outputs))
    shown_on = device.name if pool is None else f"{len(pool)} devices ({', '.join(d.name for d in pool)})"
    layout = None
    if args.output is not None and form == "npy" and not _special_file(args.output) and args.key is None \
            and len(model.input_shapes) == 1 and len(outputs) == 1 and Path(args.input).suffix.lower() == ".npy":
        layout = npy_layout(args.input)
    if layout is not None:   # .npy to .npy: in chunks, in bounded memory, whatever the input's size
        shapes = stream_predict(model, args.input, args.output, layout, args.batch_size, devices=pool,
                                source=args.input, overwrite_source=args.force)
        _report(f"{_shown(args.model, args.weights)} on {shown_on}: {shapes[0]} -> {shapes[1]} written to "
                f"{args.output}", _report_stream(args.output), str(args.output))
        return 0
    x = _read_inputs(model, args.input, args.key)
    y = _named_outputs(model, model.predict(x, batch_size=args.batch_size, verbose=0, devices=pool))
    output_name = getattr(outputs[0], "name", None) or model.layers[-1].name
    if args.output is not None:
        write_file(args.output, _save_predictions(y, form, output_name), source=args.input,
                   overwrite_source=args.force)
        where = str(args.output)
    elif sys.stdout.isatty():
        for name, out in (y.items() if isinstance(y, dict) else [(None, y)]):
            if name is not None:
                print(f"output {name}:")
            _print_table(out)
        where = "the terminal"
    else:
        write_stdout(_save_predictions(y, form))
        where = "stdout (.npz)" if isinstance(y, dict) else "stdout (.npy)"
    _report(f"{_shown(args.model, args.weights)} on {shown_on}: {_shape_text(x)} -> {_shape_text(y)} written to "
            f"{where}", _report_stream(args.output), where)
    return 0


def _print_table(y) -> None:
    rows = y.reshape(y.shape[0], -1)
    print(f"{'sample':>6} " + " ".join(f"{f'y[{j}]':>11}" for j in range(rows.shape[1])))
    for i, row in enumerate(rows):
        print(f"{i:>6} " + " ".join(f"{v:>11.5g}" for v in row))


def cmd_verify(args) -> int:

    if Path(args.model).is_file() and is_malinn_file(args.model):
        raise MalinnError(f"{args.model} is a malinn model file; verify runs the model in Keras and needs the "
                          "original Keras file (.keras or .h5) it was converted from")
    if args.key and not args.input:
        raise UsageError("verify: --key chooses an array of the --input file; give --input too")
    device = _device(args)
    model = load_model(args.model, weights=args.weights, precision=args.precision)
    tolerance = args.tolerance if args.tolerance is not None else VERIFY_TOLERANCE.get(model.precision, 1e-5)
    if args.input:
        x = _read_inputs(model, args.input, args.key)
    else:
        rng = np.random.default_rng(0)
        x = [rng.standard_normal((16,) + tuple(s)).astype(np.float32) for s in model.input_shapes]
        x = x[0] if len(x) == 1 else dict(zip(model.input_names, x))
    names = [layer.keras_names[-1] for layer in model.layers if layer.keras_names]
    ours = model.predict_layers(x)   # first: a wrong input is refused with malinn's message, before Keras starts
    outputs = model.predict(x)
    outputs = list(outputs.values()) if isinstance(outputs, dict) else (
        outputs if isinstance(outputs, list) else [outputs])
    with tempfile.TemporaryDirectory() as tmp:
        x_path, out_path = os.path.join(tmp, "x.npz"), os.path.join(tmp, "keras.npz")
        arrays = list(x.values()) if isinstance(x, dict) else [x]
        input_names = getattr(model, "input_names", [])   # a Functional's (a Sequential has one input)
        try:
            np.savez(x_path, names=np.array(input_names, dtype=str), **{f"x{i}": a for i, a in enumerate(arrays)})
        except OSError as exc:   # numpy's error names no file: a full or read-only TMPDIR
            raise OSError(f"writing the inputs for Keras to {x_path} failed ({exc.strerror or exc}); set TMPDIR "
                          f"to a folder with room") from None
        print("malinn verify: running the model in Keras (a TensorFlow process: its start alone takes seconds)...",
              file=sys.stderr, flush=True)
        run = subprocess.run(_keras_reference_command(str(args.model), x_path, out_path, names, args.weights),
                             capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if run.returncode != 0:
            if "No module named 'tensorflow'" in run.stderr or "No module named 'keras'" in run.stderr:
                raise MalinnError("verify needs TensorFlow to run the Keras model: pip install tensorflow-cpu")
            raise MalinnError(f"running {_shown(args.model, args.weights)} in Keras failed: {_exception_line(run.stderr)}")
        reference = dict(np.load(out_path, allow_pickle=False))
    computed = [str(d) for d in reference.pop("compute_dtypes", ["float32"])]
    reduced = [d for d in computed if d in KERAS_REDUCED_TOLERANCE]
    if args.tolerance is None and reduced and max(KERAS_REDUCED_TOLERANCE[d] for d in reduced) > tolerance:
        tolerance = max(KERAS_REDUCED_TOLERANCE[d] for d in reduced)
    print(f"verify {_shown(args.model, args.weights)} on {device.name} in {model.precision}, input {_shape_text(x)}; "
          f"rel = max|malinn - keras| / max(1, max|keras|), keras in {', '.join(computed)}")
    if reduced:
        quantized = ", rounding their inputs to int8 too" if "int8" in reduced else ""
        print(f"(Keras computed layers in {' and '.join(reduced)}{quantized}; malinn computes them in float32: the "
              f"errors below are mostly Keras's rounding; default tolerance "
              f"{max(KERAS_REDUCED_TOLERANCE[d] for d in reduced):g})")
    rows, called = [], set()
    for layer, out in zip(model.layer_calls, ours):   # Keras gives a shared layer's first call only
        first = layer.name not in called
        called.add(layer.name)
        rows.append((layer.name, _keras_label(layer.keras_names),
                     layer.keras_names[-1] if layer.keras_names and first else None, out))
    if len(outputs) == 1:
        rows.append(("(model output)", "output", "output", outputs[0]))
    else:
        rows += [(f"(model output {j})", f"output {j}", f"output:{j}", out) for j, out in enumerate(outputs)]
    left = max(28, max(len(r[0]) for r in rows) + 1)
    right = max(28, max(len(r[1]) for r in rows) + 1)
    print(f"{'malinn layer':<{left}} {'keras layers':<{right}} {'max abs':>10} {'rel':>10}")
    worst = 0.0
    for name, label, keras_name, out in rows:
        key = keras_name if keras_name is None or keras_name.startswith("output") else f"layer:{keras_name}"
        if key not in reference:
            print(f"{name:<{left}} {label:<{right}} {'(not compared)':>21}")
            continue
        cells, rel = _compared(out, np.asarray(reference[key], dtype=np.float32))
        worst = max(worst, rel)
        print(f"{name:<{left}} {label:<{right}} {cells}")
    for _, label, keras_name, out in rows[len(rows) - len(outputs):]:   # the model's output(s)
        if keras_name in reference:
            agreement = _argmax_agreement(out, np.asarray(reference[keras_name], dtype=np.float32))
            print(agreement if len(outputs) == 1 else f"{label}: {agreement}")
    ok = worst <= tolerance
    print(f"{'OK' if ok else 'MISMATCH'}: worst rel error {worst:.3e} (tolerance {tolerance:g})")
    return 0 if ok else 1


def _compared(out, ref) -> tuple[str, float]:
    """verify's cells for malinn's ``out`` against Keras's ``ref`` (max abs and rel, or both shapes
    where a sample's values differ in number: an infinite error) and the rel error."""
    if (out.shape[:1], out[0].size if out.ndim else 1) != (ref.shape[:1], ref[0].size if ref.ndim else 1):
        return f"shapes differ: malinn {_shape_text(out)}, keras {_shape_text(ref)}", math.inf
    abs_err, rel = _errors(out, ref)
    return f"{abs_err:>10.3e} {rel:>10.3e}", rel


def _errors(out, ref) -> tuple[float, float]:
    """``(max abs, rel)`` of malinn's ``out`` against Keras's ``ref`` (rel: over max(1, max|ref|)),
    both over the finite values; a value where one side is NaN or infinite and the other is not the
    same NaN or infinity counts as an infinite error."""
    out, ref = out.reshape(out.shape[0], -1), ref.reshape(out.shape[0], -1)
    finite = np.isfinite(out) & np.isfinite(ref)
    alike = (np.isnan(out) & np.isnan(ref)) | (np.isinf(out) & (out == ref))
    if not np.all(finite | alike):
        return math.inf, math.inf
    if not finite.any():
        return 0.0, 0.0
    abs_err = float(np.max(np.abs(out[finite] - ref[finite])))
    return abs_err, abs_err / max(1.0, float(np.max(np.abs(ref[finite]))))


def _exception_line(stderr: str) -> str:
    """The exception a child's ``stderr`` ends with: the first line naming one (``ValueError: ...``)
    after its last traceback (not one Python ignored at exit), with the line after it where Keras
    puts the cause ("Exception encountered when calling ..."); else the last line."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line == "Traceback (most recent call last):"
              and not (i and lines[i - 1].startswith("Exception ignored"))]
    tail = lines[starts[-1]:] if starts else lines
    named = [i for i, line in enumerate(tail) if re.match(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b.*:", line)]
    if not named:
        return (lines or ["(no output)"])[-1]
    i = named[0]
    cause = tail[i + 1] if "Exception encountered when calling" in tail[i] and i + 1 < len(tail) else ""
    return tail[i] + (f" {cause}" if cause else "")


def _argmax_agreement(ours, reference) -> str:
    """``argmax agreement: 97/100 samples (...)``: samples whose largest output is the same (a sample
    with a NaN on one side only never agrees)."""
    ours, reference = ours.reshape(ours.shape[0], -1), reference.reshape(reference.shape[0], -1)
    if ours.shape[1] < 2:
        return "argmax agreement: not applicable (one output per sample)"
    same = int(np.sum((np.argmax(ours, axis=1) == np.argmax(reference, axis=1))
                      & (np.isnan(ours).any(axis=1) == np.isnan(reference).any(axis=1))))
    return f"argmax agreement: {same}/{ours.shape[0]} samples ({100.0 * same / max(1, ours.shape[0]):.2f}%)"


def cmd_summary(args) -> int:
    _device(args)
    load_model(args.model, weights=args.weights, precision=args.precision).summary(batch=args.batch, show_kernels=True)
    return 0


def _count(n: int, noun: str) -> str:
    """``1 plan``, ``2 plans``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def cmd_warm(args) -> int:
    """Plans each model at each batch size and runs one pass of zeros on it, so that the kernel
    programs the plans need are in the program-binary cache (and a driver that compiles a kernel
    again at its first launch, PoCL, has done so into its own cache) before the application starts."""
    if switch("MALINN_BINARY_CACHE", True) is False:
        raise MalinnError("MALINN_BINARY_CACHE=0 turns the program cache off: the programs warm builds would be "
                          "lost with this process; unset it")
    device = _device(args)
    if device.backend == "gles3":
        raise MalinnError(f"{device.name} ({device.backend}) keeps no program binaries: it builds its shaders in "
                          "every process, so there is nothing to warm")
    batches = list(dict.fromkeys(args.batch or [1]))
    counters = device.counters
    built = loaded = plans = 0
    started = time.perf_counter()
    with reported_by_caller():   # a terminal still shows the builds as they go; the lines below report them
        for source in args.model:
            model = load_model(source, precision=args.precision)
            for batch in batches:
                builds, hits, begun = counters.get("builds", 0), counters.get("binary_hits", 0), time.perf_counter()
                samples = max(1, min(batch, model.max_batch(device, limit=batch)))   # as predict splits it
                plan = model.plan(samples, device)
                plan.run([np.zeros((1,) + tuple(shape), np.float32) for shape in model.input_shapes])
                now_built, now_loaded = counters.get("builds", 0) - builds, counters.get("binary_hits", 0) - hits
                built, loaded, plans = built + now_built, loaded + now_loaded, plans + 1
                planned = f" (planned as {batch_bucket(samples)})" if batch_bucket(samples) != batch else ""
                print(f"{source} at batch {batch}{planned}: {_count(now_built, 'kernel program')} built, {now_loaded} "
                      f"loaded from the program cache ({time.perf_counter() - begun:.1f} s)", flush=True)
    print(f"warm on {device.name}: {_count(plans, 'plan')} of {_count(len(args.model), 'model')}, "
          f"{_count(built, 'kernel program')} built, {loaded} loaded from the program cache, in "
          f"{time.perf_counter() - started:.1f} s "
          f"(cache: {cache_dir()})")
    return 0


def _keras_label(keras_names) -> str:
    """The Keras layers one malinn layer computes: ``dense + batch_normalization (folded)``."""
    if not keras_names:
        return "-"
    return " + ".join(keras_names) + (" (folded)" if len(keras_names) > 1 else "")


def _keras_reference_command(model: str, x_path: str, out_path: str, names, weights=None) -> list:
    """``python -I`` running malinn.cli.tf_reference with an explicit sys.path: nothing from the cwd.

    Isolated mode drops the cwd (and the script's folder, PYTHON* variables and the user's
    site-packages) from the child's path, so a ``keras.py`` or ``numpy.py`` beside the model
    cannot run. The child gets this process's path instead, minus the cwd, with malinn's own
    location first.
    """
    package_root = str(Path(__file__).resolve().parent.parent)
    cwd = os.getcwd()
    paths = [package_root] + [os.path.abspath(p) for p in sys.path
                              if p and os.path.abspath(p) not in (cwd, package_root)]
    bootstrap = ("import sys; sys.path[:] = {!r} + [p for p in sys.path if p and p not in {!r}]; "
                 "from malinn.cli.tf_reference import main; sys.exit(main(sys.argv[1:]))").format(paths, paths)
    extra = [] if weights is None else [f"--weights={os.path.abspath(weights)}"]
    return [sys.executable, "-I", "-c", bootstrap, *extra, model, x_path, out_path, *names]


def cmd_tune(args) -> int:

    _check_cache_dir(cache_dir())
    device = _device(args)
    shapes = args.shape
    if shapes:
        for m, k, n in shapes:
            largest = 4 * max(m * k, k * n, m * n)
            if largest > device.max_allocation:
                raise MalinnError(f"--shape {m}x{k}x{n}: a matrix of {largest / 2**20:.0f} MiB exceeds "
                                  f"{device.name}'s largest allocation ({device.max_allocation // 2**20} MiB)")
    convs = []
    if args.model and shapes:
        raise UsageError("tune: --model tunes the model's own shapes; give --model or --shape, not both "
                         "(see malinn tune --help)")
    if args.batch is not None and not args.model:
        raise UsageError("tune: --batch is the batch a --model is tuned for; give --model with it "
                         "(see malinn tune --help)")
    batch = 100 if args.batch is None else args.batch
    if args.model:
        model = load_model(args.model, precision=args.precision)
        largest = model.max_batch(device, limit=batch)
        if largest < batch:   # no pass runs it: predict splits such a batch into passes of the largest
            raise UsageError(f"tune: --batch {batch} is more samples than one pass of {args.model} holds on "
                             f"{device.name} (at most {largest}: predict runs a larger batch in passes of {largest}); "
                             f"give --batch {largest} or less")
        shapes = [shape for size in (batch, 1) for shape in model.matmul_shapes(size, device)]
        convs = [g for size in (batch, 1) for g in model.conv_geometries(size, device)]
        if not shapes and not convs:
            raise MalinnError(f"{args.model} has no Dense or convolution layer to tune for")
    started = time.perf_counter()   # --budget covers the whole run: the convolutions get what is left
    if shapes or not args.model:   # the shapes asked for, or else the standard set
        _tune_matmuls(args, device, shapes)
    if convs:
        left = None if args.budget is None else max(0.0, args.budget - (time.perf_counter() - started))
        print(f"tuning {len(set(convs))} convolution layers on {device.name}", flush=True)
        found = tune_convs(convs, device, quick=args.quick, budget_s=left, stream=sys.stdout)
        print(f"{len(found['convs'])} convolutions tuned ({', '.join(found['untuned']) or 'none'} left untuned), "
              f"{found['candidates']} candidates timed; stored in {found['path']}")
    return 0


def _tune_matmuls(args, device, shapes) -> None:
    print(f"tuning matmul on {device.name}" + (f" for {args.model}" if args.model else ""), flush=True)
    best = tune(device, shapes=shapes, quick=args.quick, budget_s=args.budget, per_shape=bool(args.model),
                precision=args.precision)
    failed = best.get("failed") or []
    for entry in failed[:5]:
        print(f"failed: {_described(entry)}: {entry['why']}")
    if len(failed) > 5:
        print(f"... and {len(failed) - 5} more candidates failed")
    if args.model:
        for shape, won in best["shapes"].items():
            kept = " (kept: the stored winner measured faster than this run's)" if shape in best["kept"] else ""
            print(f"{shape}: {_described(won)} - {won['gflops']:.1f} GFLOP/s{kept}")
        print(f"{len(best['shapes'])} shapes tuned ({', '.join(best['untuned']) or 'none'} left untuned), "
              f"{best['candidates']} candidates timed; stored in {best['path']}")
        return
    if best.get("kept"):
        print(f"kept the stored winner {_described(best)} - {best['gflops']:.1f} GFLOP/s: it measured faster than "
              f"this run's best, cut short by its budget after {best['candidates']} candidates ({best['path']})")
        return
    print(f"best: {_described(best)} - {best['gflops']:.1f} GFLOP/s over {len(best['shapes'])} shapes, "
          f"{best['candidates']} candidates timed; stored in {best['path']}")


def _described(winner: dict) -> str:
    """A winner's codename and its defines (``gemm_tiled MWG=64 ...``; the codename alone where it has none)."""
    defines = winner.get("defines") if isinstance(winner.get("defines"), dict) else {}
    return " ".join([str(winner["codename"])] + [f"{k}={v}" for k, v in defines.items()])


def _check_cache_dir(folder: Path) -> None:
    """Fails before any timing when the tuning cache cannot be written."""
    source = "MALINN_CACHE_DIR" if os.environ.get("MALINN_CACHE_DIR") else "the cache folder"
    if folder.exists() and not folder.is_dir():
        raise MalinnError(f"{source} {folder} is a file, not a folder; the tuning result could not be stored")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MalinnError(f"{source} {folder} cannot be created ({exc.strerror or exc})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise MalinnError(f"{source} {folder} is not writable; the tuning result could not be stored")


# ------------------------------------------------------------------ parser and main
def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="malinn", description="Run Keras models on OpenCL devices.")
    parser.add_argument("--version", action="version", version=f"malinn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def add(name, help_text, func):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    device_help = ("gpu, cpu, P:D, part of a device name, or gl (gl:N, gl:NAME) for the OpenGL backend, gles3 for "
                   "its vertex-shader path (GPUs without compute shaders) (default: MALINN_DEVICE, else the first "
                   "GPU, else the first CPU)")
    input_help = ("input samples: .npy, .npz (one array, or --key; for a model of several inputs one array per "
                  "input name) or .csv (one sample per row); - reads standard input")
    key_help = "the array to use from a .npz input holding several"
    weights_help = ("the weights file (model.save_weights: Keras 2 .h5 or Keras 3 .weights.h5) when the model is "
                    "an architecture JSON (model.to_json()); - reads standard input")

    p = add("convert", "convert a Keras .keras/.h5 file (or a .json architecture with --weights) into a malinn "
                       "model file", cmd_convert)
    p.add_argument("src", help="Keras .keras or .h5 file (Keras 2 or 3), or an architecture .json with --weights; - "
                               "reads standard input (then give the output)")
    p.add_argument("--weights", help=weights_help)
    p.add_argument("dest", nargs="?", metavar="output", help="malinn model file to write, as -o gives it")
    p.add_argument("-o", "--output", help="malinn model file to write (atomically; a symlink is followed, a device "
                                          "or FIFO written through; - writes its bytes to standard output; default: "
                                          "the source's name with .malinn)")
    p.add_argument("--target", help="matmul kernel codename, or gpu/cpu/accelerator (gl, gl:cpu: the OpenGL "
                                    "backend's; gles3: its vertex-shader path's), whose layouts the weights are "
                                    "stored in (default: the current device's kernel; a given target needs no device)")
    p.add_argument("--force", action="store_true", help="allow the output to be the source file itself")
    p.add_argument("--precision", choices=PRECISIONS, help=PRECISION_HELP + "; stored in the file (default: the "
                                                                          "source's, fp32 for a Keras file), which "
                                                                          "is written even where this device cannot "
                                                                          "run it (a note says so)")
    p.add_argument("--device", help=device_help)

    p = add("predict", "run a model on input samples", cmd_predict)
    p.add_argument("model", help="malinn model file or Keras file (an architecture .json with --weights); - reads "
                                 "standard input")
    p.add_argument("input", help=input_help)
    p.add_argument("--weights", help=weights_help)
    p.add_argument("-o", "--output", help="file to write the predictions to: .npy, .npz (one array per output; "
                                          "needed for a model of several outputs) or .csv (one row per sample) "
                                          "(default, or -: stdout: a table on a terminal, .npy/.npz bytes "
                                          "otherwise)")
    p.add_argument("--key", help=key_help)
    p.add_argument("--batch-size", type=_positive_int,
                   help="samples per device pass (default: all at once; a .npy input written to a .npy output is "
                        "read in chunks of 64 MiB, a whole number of batches, and the output written as they come: "
                        "a file larger than memory is predicted in bounded memory, with progress on stderr)")
    p.add_argument("--force", action="store_true", help="allow the output to be the model or input file")
    p.add_argument("--precision", choices=PRECISIONS, help=PRECISION_HELP + " (default: the model file's)")
    p.add_argument("--device", help=device_help + "; or several, comma-separated (0:0,0:1): the passes are spread "
                                                  "over them, one plan and one thread each")

    p = add("verify", "compare malinn with Keras (TensorFlow) layer by layer", cmd_verify)
    p.add_argument("model", help="the original Keras .keras or .h5 file, or architecture .json with --weights "
                                 "(not a malinn model file)")
    p.add_argument("--weights", help=weights_help)
    p.add_argument("--input", help=input_help + " (default: 16 standard-normal samples)")
    p.add_argument("--key", help=key_help)
    p.add_argument("--tolerance", type=_tolerance, help="largest rel error accepted (default 1e-5 in fp32, 1e-2 in "
                                                         "fp16-storage, 2e-2 in fp16, 1e-1 in int8-weights; at "
                                                         "least 1e-2 / 5e-2 where Keras computes in float16 / "
                                                         "bfloat16 or int8 (a quantized layer))")
    p.add_argument("--precision", choices=PRECISIONS, help=PRECISION_HELP + " (default: the model file's, fp32 for a "
                                                                          "Keras file); prints each layer's error "
                                                                          "against Keras and the argmax "
                                                                          "agreement")
    p.add_argument("--device", help=device_help)

    p = add("tune", "time matmul kernels and configurations (with --model, each convolution layer's algorithms "
                    "too) on this device and remember the fastest", cmd_tune)
    p.add_argument("--quick", action="store_true",
                   help="smaller shapes and 4 configurations of a tunable kernel (about 10 s on a 2-core CPU once its "
                        "kernels are compiled, 45 s the first time)")
    p.add_argument("--model", help="tune each of this model's Dense layers for its own shape, and each of its "
                                    "convolution layers' algorithms (every conv kernel the device runs, kn2row, "
                                    "kn2col and conv_implicit, in its configurations, and im2row "
                                    "and im2col) for its geometry, at --batch (as the "
                                    "plan runs it: rounded up to its batch bucket) and at batch 1, and store a winner "
                                    "per shape (default: one winner over a standard "
                                    "set of shapes)")
    p.add_argument("--batch", type=_positive_int, help="batch size to tune for with --model (default 100)")
    p.add_argument("--shape", type=_product_shape, action="append",
                   help="a product MxKxN to tune for (repeatable; not with --model)")
    p.add_argument("--budget", type=_positive_seconds,
                   help="stop trying new candidates after this many seconds (the whole run: with --model, the "
                        "convolutions get what the matmuls left; each layer's default is timed still)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help=PRECISION_HELP + " (default: fp32); matmul winners are stored per precision, "
                                         "convolution winners once per device")
    p.add_argument("--device", help=device_help)

    p = add("summary", "show a model's layers as Keras does (output shape, parameters, connections) and the "
                       "kernel that runs each on the device", cmd_summary)
    p.add_argument("model", help="malinn model file or Keras file (an architecture .json with --weights)")
    p.add_argument("--weights", help=weights_help)
    p.add_argument("--precision", choices=PRECISIONS, help=PRECISION_HELP + " (default: the model file's)")
    p.add_argument("--batch", type=_positive_int, default=1, help="the batch size whose kernels are shown (default 1)")
    p.add_argument("--device", help=device_help)

    p = add("warm", "build every kernel program the models need into the program cache (at install time: a "
                    "service's first predict then builds nothing)", cmd_warm)
    p.add_argument("model", nargs="+", help="malinn model files or Keras files")
    p.add_argument("--batch", type=_positive_int, action="append",
                   help="a batch size the application predicts with (repeatable; default 1, one sample a call): "
                        "each size up to 256 is a plan of its own, larger ones share a plan per multiple of 64")
    p.add_argument("--precision", choices=PRECISIONS, help=PRECISION_HELP + " (default: each model file's)")
    p.add_argument("--device", help=device_help)

    add("devices", "list the working OpenCL and OpenGL devices (* marks the default)", cmd_devices)
    add_serve_command(add, device_help, PRECISIONS, PRECISION_HELP)
    return parser


def _one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return " | ".join(lines) or "(no message)"


def _show_warning(message, category, filename, lineno, file=None, line=None):
    text = _one_line(message)
    text = text[len("malinn: "):] if text.startswith("malinn: ") else text
    print(f"malinn: warning: {text}", file=sys.stderr)


def _error(text: str) -> None:
    try:
        print(f"malinn: error: {_one_line(text)}", file=sys.stderr)
    except (OSError, ValueError):
        pass


def _drop_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so that Python's exit flush stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived (a service stopped, an ssh session dropped): raised where the
    command is, so that what it was writing is cleaned up as for Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _terminate(signum, frame):
    raise Terminated(signum)


@contextlib.contextmanager
def _terminations_raise():
    """SIGTERM and SIGHUP raise :class:`Terminated` while the command runs (their default ends the
    process at once: a half-written temporary file stayed beside the destination); the handlers
    before are put back after. Outside the main thread (no signals there) nothing changes."""
    wanted = [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
    before = {}
    try:
        for signum in wanted:
            before[signum] = signal.signal(signum, _terminate)
    except ValueError:   # not the main thread
        pass
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def main(argv=None) -> int:
    """Runs the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    with warnings.catch_warnings(), _terminations_raise():
        warnings.showwarning = _show_warning
        try:
            args, extra = build_parser().parse_known_args(argv)
            if extra:   # named with the command it was given to (argparse names only "malinn")
                raise UsageError(f"{args.command}: unrecognized arguments: {' '.join(extra)} "
                                 f"(see malinn {args.command} --help)")
            with stdin_as_file(args, UsageError):   # a file given as - is standard input's copy
                status = args.func(args)
            if sys.stdout is not None:   # None: started with stdout closed (its prints went nowhere)
                try:
                    sys.stdout.flush()
                except BrokenPipeError:
                    raise
                except OSError as exc:   # what the command printed could not be written (> /dev/full)
                    _drop_stdout()
                    raise MalinnError(f"stdout: cannot write ({exc.strerror or exc})") from None
            return status
        except SystemExit as exc:       # --help and --version
            return exc.code if isinstance(exc.code, int) else 0
        except KeyboardInterrupt:
            _error("interrupted")
            return 130
        except Terminated as exc:
            _error(f"terminated ({signal.Signals(exc.signum).name})")
            return 128 + exc.signum
        except BrokenPipeError:         # the reader of stdout went away (malinn predict ... | head)
            _drop_stdout()
            return 1
        except UsageError as exc:
            _error(str(exc))
            return 2
        except MalinnError as exc:
            _error(str(exc))
            return 1
        except MemoryError:
            _error("out of memory")
            return 1
        except (OSError, ValueError) as exc:   # file-system errors, bad shapes: worded for users
            _error(str(exc) or type(exc).__name__)
            return 1
        except Exception as exc:
            _error(f"unexpected {type(exc).__name__}: {exc} (please report this as a malinn bug)")
            return 1

