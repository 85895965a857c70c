"""The ``malinn`` command: convert, predict, verify, tune, devices.

Exit codes: 0 success, 1 a malinn error (bad model file, device failure, verify mismatch),
2 a usage error.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from . import __version__
from .errors import MalinnError


def _device(args):
    import malinn

    if getattr(args, "device", None):
        malinn.set_device(args.device)
    return malinn.get_device()


def cmd_devices(args) -> int:
    import malinn

    found = malinn.devices()
    if not found:
        print("no working OpenCL device (install a driver, e.g. apt-get install pocl-opencl-icd)")
        return 1
    current = malinn.get_device()
    for d in found:
        print(("* " if d is current else "  ") + str(d))
    return 0


def cmd_convert(args) -> int:
    import malinn

    _device(args)
    model = malinn.load_model(args.src)
    path = model.save(args.output, target=args.target)
    target = malinn.saving.resolve_target(args.target).codename
    print(f"{args.src} -> {path}: {len(model.layers)} layers, {model.count_params()} parameters, "
          f"input {(None,) + tuple(model.input_shape)}, weights laid out for {target}")
    return 0


def cmd_predict(args) -> int:
    import malinn

    device = _device(args)
    model = malinn.load_model(args.model)
    try:
        x = np.load(args.input, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise MalinnError(f"{args.input}: cannot read a .npy array ({exc})") from None
    y = model.predict(x, batch_size=args.batch_size)
    out = Path(args.output)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".npy", dir=out.parent if str(out.parent) else ".")
    os.close(fd)
    try:
        np.save(tmp, y)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    print(f"{args.model} on {device.name}: {x.shape} -> {y.shape} written to {out}")
    return 0


def cmd_verify(args) -> int:
    import malinn

    device = _device(args)
    model = malinn.load_model(args.model)
    if args.input:
        x = np.load(args.input, allow_pickle=False).astype(np.float32)
    else:
        x = np.random.default_rng(0).standard_normal((16,) + tuple(model.input_shape)).astype(np.float32)
    names = [layer.keras_names[-1] for layer in model.layers if layer.keras_names]
    with tempfile.TemporaryDirectory() as tmp:
        x_path, out_path = os.path.join(tmp, "x.npy"), os.path.join(tmp, "keras.npz")
        np.save(x_path, x)
        run = subprocess.run([sys.executable, "-m", "malinn.tf_reference", str(args.model), x_path, out_path, *names],
                             capture_output=True, text=True)
        if run.returncode != 0:
            tail = run.stderr.strip().splitlines()[-1:] or ["(no output)"]
            if "No module named 'tensorflow'" in run.stderr or "No module named 'keras'" in run.stderr:
                raise MalinnError("verify needs TensorFlow to run the Keras model: pip install tensorflow-cpu")
            raise MalinnError(f"running {args.model} in Keras failed: {tail[0]}")
        reference = dict(np.load(out_path))
    ours = model.predict_layers(x)
    print(f"verify {args.model} on {device.name}, input {x.shape}; rel = max|malinn - keras| / max(1, max|keras|)")
    print(f"{'malinn layer':<28} {'keras layer':<28} {'max abs':>10} {'rel':>10}")
    worst = 0.0
    rows = [(layer.name, layer.keras_names[-1] if layer.keras_names else None, out) for layer, out in zip(model.layers, ours)]
    rows.append(("(model output)", "output", ours[-1]))
    for name, keras_name, out in rows:
        key = "output" if keras_name == "output" else f"layer:{keras_name}"
        if key not in reference:
            print(f"{name:<28} {str(keras_name):<28} {'(not compared)':>21}")
            continue
        ref = reference[key].reshape(out.shape[0], -1)
        abs_err = float(np.nanmax(np.abs(out - ref))) if out.size else 0.0
        rel = abs_err / max(1.0, float(np.nanmax(np.abs(ref))) if ref.size else 1.0)
        worst = max(worst, rel)
        print(f"{name:<28} {str(keras_name):<28} {abs_err:>10.3e} {rel:>10.3e}")
    ok = worst <= args.tolerance
    print(f"{'OK' if ok else 'MISMATCH'}: worst rel error {worst:.3e} (tolerance {args.tolerance:g})")
    return 0 if ok else 1


def cmd_tune(args) -> int:
    import malinn
    from .tuner import tune

    device = _device(args)
    shapes = None
    if args.shape:
        try:
            shapes = [tuple(int(v) for v in text.lower().split("x")) for text in args.shape]
            assert all(len(s) == 3 and min(s) >= 1 for s in shapes)
        except (ValueError, AssertionError):
            raise MalinnError(f"--shape expects MxKxN with positive integers, got {args.shape}") from None
    elif args.model:
        model = malinn.load_model(args.model)
        dims, shapes = model.input_dim, []
        for layer in model.layers:
            if hasattr(layer, "units"):
                shapes += [(layer.units, dims, args.batch), (layer.units, dims, 1)]
            dims = layer.output_dim(dims)
        if not shapes:
            raise MalinnError(f"{args.model} has no Dense layer to tune for")
    print(f"tuning matmul on {device.name}" + (f" for {args.model}" if args.model else ""), flush=True)
    best = tune(device, shapes=shapes, quick=args.quick, budget_s=args.budget, per_shape=bool(args.model))
    if args.model:
        for shape, won in best["shapes"].items():
            config = " ".join(f"{k}={v}" for k, v in won["defines"].items())
            print(f"{shape}: {won['codename']} {config} - {won['gflops']:.1f} GFLOP/s")
        print(f"{len(best['shapes'])} shapes tuned ({', '.join(best['untuned']) or 'none'} left untuned), "
              f"{best['candidates']} candidates timed; stored in {best['path']}")
        return 0
    config = " ".join(f"{k}={v}" for k, v in best["defines"].items())
    print(f"best: {best['codename']} {config} - {best['gflops']:.1f} GFLOP/s over {len(best['shapes'])} shapes, "
          f"{best['candidates']} candidates timed; stored in {best['path']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="malinn", description="Run Keras models on OpenCL devices.")
    parser.add_argument("--version", action="version", version=f"malinn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def add(name, help_text, func):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    p = add("convert", "convert a Keras .keras/.h5 file into a malinn model file", cmd_convert)
    p.add_argument("src", help="Keras .keras or .h5 file (Keras 2 or 3)")
    p.add_argument("-o", "--output", required=True, help="malinn model file to write (atomically)")
    p.add_argument("--target", help="matmul kernel codename, or gpu/cpu/accelerator, whose layouts the weights are "
                                    "stored in (default: the current device's kernel)")
    p.add_argument("--device", help="gpu, cpu, P:D or part of a device name (default: MALINN_DEVICE, else first GPU)")

    p = add("predict", "run a model on inputs from a .npy file", cmd_predict)
    p.add_argument("model", help="malinn model file or Keras file")
    p.add_argument("input", help=".npy array of shape (batch, ...) matching the model's input")
    p.add_argument("-o", "--output", required=True, help=".npy file to write the predictions to")
    p.add_argument("--batch-size", type=int, help="samples per device pass (default: all at once)")
    p.add_argument("--device", help="gpu, cpu, P:D or part of a device name")

    p = add("verify", "compare malinn with Keras (TensorFlow) layer by layer", cmd_verify)
    p.add_argument("model", help="Keras .keras or .h5 file")
    p.add_argument("--input", help=".npy input (default: 16 standard-normal samples)")
    p.add_argument("--tolerance", type=float, default=1e-5, help="largest rel error accepted (default 1e-5)")
    p.add_argument("--device", help="gpu, cpu, P:D or part of a device name")

    p = add("tune", "time matmul kernels and configurations on this device and remember the fastest", cmd_tune)
    p.add_argument("--quick", action="store_true",
                   help="smaller shapes and 4 configurations of a tunable kernel (under 30 s on a 2-core CPU)")
    p.add_argument("--model", help="tune each of this model's Dense layers for its own shape, at --batch and at "
                                    "batch 1, and store a winner per shape (default: one winner over a standard "
                                    "set of shapes)")
    p.add_argument("--batch", type=int, default=100, help="batch size to tune for with --model (default 100)")
    p.add_argument("--shape", action="append", help="a product MxKxN to tune for (repeatable)")
    p.add_argument("--budget", type=float, help="stop trying new candidates after this many seconds")
    p.add_argument("--device", help="gpu, cpu, P:D or part of a device name")

    add("devices", "list the working OpenCL devices (* marks the default)", cmd_devices)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except MalinnError as exc:
        print(f"malinn: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"malinn: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # bad input shapes and the like, already worded for users
        print(f"malinn: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
