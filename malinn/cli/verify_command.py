"""``malinn verify``: malinn's outputs beside Keras's (computed in a process of its own), layer by layer."""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ..errors import MalinnError
from ..model.saving import is_malinn_file, load_model
from .arguments import UsageError, device_of
from .outputs import read_inputs, shape_text, shown

#: verify's default tolerance (largest rel error) per precision: a little above the worst layer of
#: the test zoo and the digits example measured in that precision (docs/CONVERTING.md)
VERIFY_TOLERANCE = {"fp32": 1e-5, "fp16-storage": 1e-2, "fp16": 2e-2, "int8-weights": 1e-1}


#: the least default tolerance where Keras itself computed in a reduced precision (a mixed_float16
#: or mixed_bfloat16 policy, a float16 or bfloat16 layer; an int8-quantized layer, whose inputs
#: Keras rounds to int8 too): malinn computes such layers in float32 (with the int8 weights)
KERAS_REDUCED_TOLERANCE = {"float16": 1e-2, "bfloat16": 5e-2, "int8": 5e-2}


def cmd_verify(args: argparse.Namespace) -> int:

    if Path(args.model).is_file() and is_malinn_file(args.model):
        raise MalinnError(
            f"{args.model} is a malinn model file; verify runs the model in Keras and needs the "
            "original Keras file (.keras or .h5) it was converted from"
        )
    if args.key and not args.input:
        raise UsageError("verify: --key chooses an array of the --input file; give --input too")
    device = device_of(args)
    model = load_model(args.model, weights=args.weights, precision=args.precision)
    tolerance = args.tolerance if args.tolerance is not None else VERIFY_TOLERANCE.get(model.precision, 1e-5)
    if args.input:
        x = read_inputs(model, args.input, args.key)
    else:
        rng = np.random.default_rng(0)
        x = [rng.standard_normal((16,) + tuple(s)).astype(np.float32) for s in model.input_shapes]
        x = x[0] if len(x) == 1 else dict(zip(model.input_names, x))
    names = [layer.keras_names[-1] for layer in model.layers if layer.keras_names]
    ours = model.predict_layers(x)  # first: a wrong input is refused with malinn's message, before Keras starts
    outputs = model.predict(x)
    outputs = (
        list(outputs.values()) if isinstance(outputs, dict) else (outputs if isinstance(outputs, list) else [outputs])
    )
    with tempfile.TemporaryDirectory() as tmp:
        x_path, out_path = os.path.join(tmp, "x.npz"), os.path.join(tmp, "keras.npz")
        arrays = list(x.values()) if isinstance(x, dict) else [x]
        input_names = getattr(model, "input_names", [])  # a Functional's (a Sequential has one input)
        try:
            np.savez(x_path, names=np.array(input_names, dtype=str), **{f"x{i}": a for i, a in enumerate(arrays)})
        except OSError as exc:  # numpy's error names no file: a full or read-only TMPDIR
            raise OSError(
                f"writing the inputs for Keras to {x_path} failed ({exc.strerror or exc}); set TMPDIR "
                f"to a folder with room"
            ) from None
        print(
            "malinn verify: running the model in Keras (a TensorFlow process: its start alone takes seconds)...",
            file=sys.stderr,
            flush=True,
        )
        run = subprocess.run(
            _keras_reference_command(str(args.model), x_path, out_path, names, args.weights),
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        if run.returncode != 0:
            if "No module named 'tensorflow'" in run.stderr or "No module named 'keras'" in run.stderr:
                raise MalinnError("verify needs TensorFlow to run the Keras model: pip install tensorflow-cpu")
            raise MalinnError(
                f"running {shown(args.model, args.weights)} in Keras failed: {exception_line(run.stderr)}"
            )
        reference = dict(np.load(out_path, allow_pickle=False))
    computed = [str(d) for d in reference.pop("compute_dtypes", ["float32"])]
    reduced = [d for d in computed if d in KERAS_REDUCED_TOLERANCE]
    if args.tolerance is None and reduced and max(KERAS_REDUCED_TOLERANCE[d] for d in reduced) > tolerance:
        tolerance = max(KERAS_REDUCED_TOLERANCE[d] for d in reduced)
    print(
        f"verify {shown(args.model, args.weights)} on {device.name} in {model.precision}, input {shape_text(x)}; "
        f"rel = max|malinn - keras| / max(1, max|keras|), keras in {', '.join(computed)}"
    )
    if reduced:
        quantized = ", rounding their inputs to int8 too" if "int8" in reduced else ""
        print(
            f"(Keras computed layers in {' and '.join(reduced)}{quantized}; malinn computes them in float32: the "
            f"errors below are mostly Keras's rounding; default tolerance "
            f"{max(KERAS_REDUCED_TOLERANCE[d] for d in reduced):g})"
        )
    rows, called = [], set()
    for layer, out in zip(model.layer_calls, ours):  # Keras gives a shared layer's first call only
        first = layer.name not in called
        called.add(layer.name)
        rows.append(
            (
                layer.name,
                _keras_label(layer.keras_names),
                layer.keras_names[-1] if layer.keras_names and first else None,
                out,
            )
        )
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
        cells, rel = compared(out, np.asarray(reference[key], dtype=np.float32))
        worst = max(worst, rel)
        print(f"{name:<{left}} {label:<{right}} {cells}")
    for _, label, keras_name, out in rows[len(rows) - len(outputs) :]:  # the model's output(s)
        if keras_name in reference:
            agreement = argmax_agreement(out, np.asarray(reference[keras_name], dtype=np.float32))
            print(agreement if len(outputs) == 1 else f"{label}: {agreement}")
    ok = worst <= tolerance
    print(f"{'OK' if ok else 'MISMATCH'}: worst rel error {worst:.3e} (tolerance {tolerance:g})")
    return 0 if ok else 1


def compared(out: np.ndarray, ref: np.ndarray) -> tuple[str, float]:
    """verify's cells for malinn's ``out`` against Keras's ``ref`` (max abs and rel, or both shapes
    where a sample's values differ in number: an infinite error) and the rel error."""
    if (out.shape[:1], out[0].size if out.ndim else 1) != (ref.shape[:1], ref[0].size if ref.ndim else 1):
        return f"shapes differ: malinn {shape_text(out)}, keras {shape_text(ref)}", math.inf
    abs_err, rel = error_sizes(out, ref)
    return f"{abs_err:>10.3e} {rel:>10.3e}", rel


def error_sizes(out: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
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


def exception_line(stderr: str) -> str:
    """The exception a child's ``stderr`` ends with: the first line naming one (``ValueError: ...``)
    after its last traceback (not one Python ignored at exit), with the line after it where Keras
    puts the cause ("Exception encountered when calling ..."); else the last line."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    starts = [
        i
        for i, line in enumerate(lines)
        if line == "Traceback (most recent call last):" and not (i and lines[i - 1].startswith("Exception ignored"))
    ]
    tail = lines[starts[-1] :] if starts else lines
    named = [i for i, line in enumerate(tail) if re.match(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b.*:", line)]
    if not named:
        return (lines or ["(no output)"])[-1]
    i = named[0]
    cause = tail[i + 1] if "Exception encountered when calling" in tail[i] and i + 1 < len(tail) else ""
    return tail[i] + (f" {cause}" if cause else "")


def argmax_agreement(ours: np.ndarray, reference: np.ndarray) -> str:
    """``argmax agreement: 97/100 samples (...)``: samples whose largest output is the same (a sample
    with a NaN on one side only never agrees)."""
    ours, reference = ours.reshape(ours.shape[0], -1), reference.reshape(reference.shape[0], -1)
    if ours.shape[1] < 2:
        return "argmax agreement: not applicable (one output per sample)"
    same = int(
        np.sum(
            (np.argmax(ours, axis=1) == np.argmax(reference, axis=1))
            & (np.isnan(ours).any(axis=1) == np.isnan(reference).any(axis=1))
        )
    )
    return f"argmax agreement: {same}/{ours.shape[0]} samples ({100.0 * same / max(1, ours.shape[0]):.2f}%)"


def _keras_label(keras_names: list | tuple | None) -> str:
    """The Keras layers one malinn layer computes: ``dense + batch_normalization (folded)``."""
    if not keras_names:
        return "-"
    return " + ".join(keras_names) + (" (folded)" if len(keras_names) > 1 else "")


def _keras_reference_command(model: str, x_path: str, out_path: str, names: list, weights: str | None = None) -> list:
    """``python -I`` running malinn.cli.tf_reference with an explicit sys.path: nothing from the cwd.

    Isolated mode drops the cwd (and the script's folder, PYTHON* variables and the user's
    site-packages) from the child's path, so a ``keras.py`` or ``numpy.py`` beside the model
    cannot run. The child gets this process's path instead, minus the cwd, with malinn's own
    location first.
    """
    package_root = str(Path(__file__).resolve().parent.parent)
    cwd = os.getcwd()
    paths = [package_root] + [
        os.path.abspath(p) for p in sys.path if p and os.path.abspath(p) not in (cwd, package_root)
    ]
    bootstrap = (
        "import sys; sys.path[:] = {!r} + [p for p in sys.path if p and p not in {!r}]; "
        "from malinn.cli.tf_reference import main; sys.exit(main(sys.argv[1:]))"
    ).format(paths, paths)
    extra = [] if weights is None else [f"--weights={os.path.abspath(weights)}"]
    return [sys.executable, "-I", "-c", bootstrap, *extra, model, x_path, out_path, *names]
