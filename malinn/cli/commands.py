"""The ``malinn`` command (also ``python3 -m malinn``): convert, predict, verify, summary, tune, warm, devices.

Exit codes: 0 success, 1 a malinn error (bad model or input file, device failure, verify
mismatch), 2 a usage error (bad arguments), 130 interrupted. Every error is one line on stderr,
``malinn: error: ...``; no traceback is ever printed.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import warnings
from collections.abc import Sequence

from ..errors import MalinnError
from ..io.streams import stdin_as_file
from ..version import __version__
from .arguments import (
    PRECISION_HELP,
    PRECISIONS,
    Parser,
    UsageError,
    positive_int,
    positive_seconds,
    product_shape,
    tolerance,
)
from .convert_command import cmd_convert
from .inspect_commands import cmd_devices, cmd_summary, cmd_warm
from .outputs import drop_stdout
from .predict_command import cmd_predict
from .serve_command import add_serve_command
from .tune_command import cmd_tune
from .verify_command import cmd_verify


# ------------------------------------------------------------------ parser and main
def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="malinn", description="Run Keras models on OpenCL devices.")
    parser.add_argument("--version", action="version", version=f"malinn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def add(name, help_text, func):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        return p

    device_help = (
        "gpu, cpu, P:D, part of a device name, or gl (gl:N, gl:NAME) for the OpenGL backend, gles3 for "
        "its vertex-shader path (GPUs without compute shaders) (default: MALINN_DEVICE, else the first "
        "GPU, else the first CPU)"
    )
    input_help = (
        "input samples: .npy, .npz (one array, or --key; for a model of several inputs one array per "
        "input name) or .csv (one sample per row); - reads standard input"
    )
    key_help = "the array to use from a .npz input holding several"
    weights_help = (
        "the weights file (model.save_weights: Keras 2 .h5 or Keras 3 .weights.h5) when the model is "
        "an architecture JSON (model.to_json()); - reads standard input"
    )

    p = add(
        "convert",
        "convert a Keras .keras/.h5 file (or a .json architecture with --weights) into a malinn model file",
        cmd_convert,
    )
    p.add_argument(
        "src",
        help="Keras .keras or .h5 file (Keras 2 or 3), or an architecture .json with --weights; - "
        "reads standard input (then give the output)",
    )
    p.add_argument("--weights", help=weights_help)
    p.add_argument("dest", nargs="?", metavar="output", help="malinn model file to write, as -o gives it")
    p.add_argument(
        "-o",
        "--output",
        help="malinn model file to write (atomically; a symlink is followed, a device "
        "or FIFO written through; - writes its bytes to standard output; default: "
        "the source's name with .malinn)",
    )
    p.add_argument(
        "--target",
        help="matmul kernel codename, or gpu/cpu/accelerator (gl, gl:cpu: the OpenGL "
        "backend's; gles3: its vertex-shader path's), whose layouts the weights are "
        "stored in (default: the current device's kernel; a given target needs no device)",
    )
    p.add_argument("--force", action="store_true", help="allow the output to be the source file itself")
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help=PRECISION_HELP + "; stored in the file (default: the "
        "source's, fp32 for a Keras file), which "
        "is written even where this device cannot "
        "run it (a note says so)",
    )
    p.add_argument("--device", help=device_help)

    p = add("predict", "run a model on input samples", cmd_predict)
    p.add_argument(
        "model", help="malinn model file or Keras file (an architecture .json with --weights); - reads standard input"
    )
    p.add_argument("input", help=input_help)
    p.add_argument("--weights", help=weights_help)
    p.add_argument(
        "-o",
        "--output",
        help="file to write the predictions to: .npy, .npz (one array per output; "
        "needed for a model of several outputs) or .csv (one row per sample) "
        "(default, or -: stdout: a table on a terminal, .npy/.npz bytes "
        "otherwise)",
    )
    p.add_argument("--key", help=key_help)
    p.add_argument(
        "--batch-size",
        type=positive_int,
        help="samples per device pass (default: all at once up to 512 MiB of input, in passes of that "
        "beyond; a .npy input written to a .npy output is read in chunks of 64 MiB, a whole number of "
        "batches, and the output written as they come: a file larger than memory is predicted in "
        "bounded memory, with progress on stderr; on PoCL, Mali or Adreno, whose activations are host "
        "memory, a pass holds at most about 256 MiB of them)",
    )
    p.add_argument("--force", action="store_true", help="allow the output to be the model or input file")
    p.add_argument("--precision", choices=PRECISIONS, help=PRECISION_HELP + " (default: the model file's)")
    p.add_argument(
        "--device",
        help=device_help + "; or several, comma-separated (0:0,0:1): the passes are spread "
        "over them, one plan and one thread each",
    )

    p = add("verify", "compare malinn with Keras (TensorFlow) layer by layer", cmd_verify)
    p.add_argument(
        "model",
        help="the original Keras .keras or .h5 file, or architecture .json with --weights (not a malinn model file)",
    )
    p.add_argument("--weights", help=weights_help)
    p.add_argument("--input", help=input_help + " (default: 16 standard-normal samples)")
    p.add_argument("--key", help=key_help)
    p.add_argument(
        "--tolerance",
        type=tolerance,
        help="largest rel error accepted (default 1e-5 in fp32, 1e-2 in "
        "fp16-storage, 2e-2 in fp16, 1e-1 in int8-weights; at "
        "least 1e-2 / 5e-2 where Keras computes in float16 / "
        "bfloat16 or int8 (a quantized layer))",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help=PRECISION_HELP + " (default: the model file's, fp32 for a "
        "Keras file); prints each layer's error "
        "against Keras and the argmax "
        "agreement",
    )
    p.add_argument("--device", help=device_help)

    p = add(
        "tune",
        "time matmul kernels and configurations (with --model, each convolution layer's algorithms "
        "too) on this device and remember the fastest",
        cmd_tune,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smaller shapes and 4 configurations of a tunable kernel (about 10 s on a 2-core CPU once its "
        "kernels are compiled, 45 s the first time)",
    )
    p.add_argument(
        "--model",
        help="tune each of this model's Dense layers for its own shape, and each of its "
        "convolution layers' algorithms (every conv kernel the device runs, kn2row, "
        "kn2col and conv_implicit, in its configurations, and im2row "
        "and im2col) for its geometry, at --batch (as the "
        "plan runs it: rounded up to its batch bucket) and at batch 1, and store a winner "
        "per shape (default: one winner over a standard "
        "set of shapes)",
    )
    p.add_argument("--batch", type=positive_int, help="batch size to tune for with --model (default 100)")
    p.add_argument(
        "--shape",
        type=product_shape,
        action="append",
        help="a product MxKxN to tune for (repeatable; not with --model)",
    )
    p.add_argument(
        "--budget",
        type=positive_seconds,
        help="stop trying new candidates after this many seconds (the whole run: with --model, the "
        "convolutions get what the matmuls left; each layer's default is timed still)",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help=PRECISION_HELP + " (default: fp32); matmul winners are stored per precision, "
        "convolution winners once per device",
    )
    p.add_argument("--device", help=device_help)

    p = add(
        "summary",
        "show a model's layers as Keras does (output shape, parameters, connections) and the "
        "kernel that runs each on the device",
        cmd_summary,
    )
    p.add_argument("model", help="malinn model file or Keras file (an architecture .json with --weights)")
    p.add_argument("--weights", help=weights_help)
    p.add_argument("--precision", choices=PRECISIONS, help=PRECISION_HELP + " (default: the model file's)")
    p.add_argument("--batch", type=positive_int, default=1, help="the batch size whose kernels are shown (default 1)")
    p.add_argument("--device", help=device_help)

    p = add(
        "warm",
        "build every kernel program the models need into the program cache (at install time: a "
        "service's first predict then builds nothing)",
        cmd_warm,
    )
    p.add_argument("model", nargs="+", help="malinn model files or Keras files")
    p.add_argument(
        "--batch",
        type=positive_int,
        action="append",
        help="a batch size the application predicts with (repeatable; default 1, one sample a call): "
        "each size up to 256 is a plan of its own, larger ones share a plan per multiple of 64",
    )
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
    text = text[len("malinn: ") :] if text.startswith("malinn: ") else text
    print(f"malinn: warning: {text}", file=sys.stderr)


def _error(text: str) -> None:
    try:
        print(f"malinn: error: {_one_line(text)}", file=sys.stderr)
    except (OSError, ValueError):
        pass


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived (a service stopped, an ssh connection dropped): raised where the
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
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    with warnings.catch_warnings(), _terminations_raise():
        warnings.showwarning = _show_warning
        try:
            args, extra = build_parser().parse_known_args(argv)
            if extra:  # named with the command it was given to (argparse names only "malinn")
                raise UsageError(
                    f"{args.command}: unrecognized arguments: {' '.join(extra)} (see malinn {args.command} --help)"
                )
            with stdin_as_file(args, UsageError):  # a file given as - is standard input's copy
                status = args.func(args)
            if sys.stdout is not None:  # None: started with stdout closed (its prints went nowhere)
                try:
                    sys.stdout.flush()
                except BrokenPipeError:
                    raise
                except OSError as exc:  # what the command printed could not be written (> /dev/full)
                    drop_stdout()
                    raise MalinnError(f"stdout: cannot write ({exc.strerror or exc})") from None
            return status
        except SystemExit as exc:  # --help and --version
            return exc.code if isinstance(exc.code, int) else 0
        except KeyboardInterrupt:
            _error("interrupted")
            return 130
        except Terminated as exc:
            _error(f"terminated ({signal.Signals(exc.signum).name})")
            return 128 + exc.signum
        except BrokenPipeError:  # the reader of stdout went away (malinn predict ... | head)
            drop_stdout()
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
        except (OSError, ValueError) as exc:  # file-system errors, bad shapes: worded for users
            _error(str(exc) or type(exc).__name__)
            return 1
        except Exception as exc:
            _error(f"unexpected {type(exc).__name__}: {exc} (please report this as a malinn bug)")
            return 1
