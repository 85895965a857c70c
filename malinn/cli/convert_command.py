"""``malinn convert``: a Keras file to a malinn model file laid out for a device."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from ..backends.base import size_text
from ..choice.kernel_choice import check_precision
from ..errors import MalinnError
from ..io.files import check_destination
from ..io.streams import STREAM, copy_to_stdout
from ..library.kernel_library import DEFAULT_PRECISION
from ..library.precision import flushed
from ..model.saving import is_malinn_file, load_model, resolve_target, save_model
from .arguments import UsageError, device_of
from .outputs import inputs_text, report, report_stream, shown

#: the size of a source (its files together) from which convert says, before each phase, what it does: reading
#: and converting, then laying out and writing, take about a second each per 40 MB on a 2-core CPU
CONVERT_ANNOUNCED_BYTES = 64 * 2**20


def default_output(src: str) -> str:
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


def _source_bytes(*paths: str | None) -> int:
    """The bytes of the files ``paths`` name (a folder's: the files in it; None or a missing path: 0)."""
    total = 0
    for path in paths:
        if path is None:
            continue
        try:
            if os.path.isdir(path):
                total += sum(
                    os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(path) for name in names
                )
            else:
                total += os.path.getsize(path)
        except OSError:
            continue
    return total


def cmd_convert(args: argparse.Namespace) -> int:
    if args.dest is not None and args.output is not None and args.dest != args.output:
        raise UsageError(
            f"convert: two outputs, {args.dest} and -o {args.output}; give one (see malinn convert --help)"
        )
    if args.output is None:  # an empty -o "" is refused below, not replaced
        if args.dest is None and getattr(args, "from_stdin", None) == "src":
            raise UsageError(
                "convert: the source is standard input (-), which has no name to give the output; "
                "give one (-o OUTPUT, or -o - for standard output)"
            )
        args.output = args.dest if args.dest is not None else default_output(args.src)
    to_stdout = args.output == STREAM
    if to_stdout and (sys.stdout is None or sys.stdout.isatty()):
        raise UsageError(
            f"convert: -o - writes the model file's bytes to standard output, which is "
            f"{'closed' if sys.stdout is None else 'a terminal'}; redirect it (> model.malinn) or give "
            "-o FILE"
        )
    if not to_stdout:
        check_destination(args.output, source=(args.src, args.weights), overwrite_source=args.force)
    device = None
    if args.device is not None or args.target is None:
        device = device_of(args)  # the target comes from the device; an explicit --target needs none
    resolve_target(args.target)  # an unknown target fails before the model is read
    size = _source_bytes(args.src, args.weights)
    announce = size >= CONVERT_ANNOUNCED_BYTES  # each phase then takes seconds: say which one runs
    if announce:
        print(
            f"malinn convert: reading {shown(args.src, args.weights)} ({size_text(size)})...",
            file=sys.stderr,
            flush=True,
        )
    model = load_model(args.src, weights=args.weights)
    recorded = model.precision if is_malinn_file(args.src) else None
    if args.precision is not None:
        model.precision = args.precision
    if announce:
        print(
            f"malinn convert: laying out the weights of {len(model.layers)} layers in {model.precision} and writing "
            f"{args.output}...",
            file=sys.stderr,
            flush=True,
        )
    if to_stdout:  # HDF5 writes with seeks: a file first, then its bytes
        with tempfile.TemporaryDirectory(prefix="malinn-stdout-") as folder:
            copy_to_stdout(save_model(model, os.path.join(folder, "model.malinn"), target=args.target))
        path: str | os.PathLike = "stdout"
    else:
        path = save_model(model, args.output, target=args.target, overwrite=args.force)
    spec = resolve_target(args.target, model.precision)
    report(
        f"{shown(args.src, args.weights)} -> {path}: {len(model.layers)} layers, {model.count_params()} "
        f"parameters, input {inputs_text(model)}, weights laid out for {spec.codename} in {model.precision}",
        report_stream(args.output),
        path,
    )
    if recorded not in (None, DEFAULT_PRECISION, model.precision):
        print(
            f"malinn: note: {args.src} holds weights rounded to {recorded}; {path} keeps those rounded "
            f"values in {model.precision} (convert the Keras file for its own float32 weights)",
            file=sys.stderr,
        )
    lost = {
        f"{layer.name} {name}": count
        for layer in model.layers
        for name, matrix in layer.precision_weights().items()
        if (count := flushed(matrix, model.precision))
    }
    if lost:  # never lower precision without saying what it cost
        print(
            f"malinn: note: {sum(lost.values())} non-zero weights are below {model.precision}'s smallest value "
            f"(about 6e-8) and are stored as 0 ({', '.join(f'{k}: {v}' for k, v in lost.items())}); "
            f"malinn verify --precision {model.precision} shows what that costs",
            file=sys.stderr,
        )
    if device is not None:
        try:  # the file may be meant for a board that runs it: written, with a note
            check_precision(model.precision, device)
        except MalinnError as error:
            print(f"malinn: note: {path} is written, but this device cannot run it: {error}", file=sys.stderr)
    return 0
