"""``malinn predict``: a model's outputs for an input file (a ``.npy`` streamed in chunks)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..backends.selection import set_device
from ..errors import MalinnError
from ..io.files import check_destination, write_file, write_stdout
from ..io.streams import STREAM
from ..model.saving import load_model
from .arguments import device_of
from .outputs import (
    named_outputs,
    output_format,
    print_table,
    read_inputs,
    report,
    report_stream,
    save_predictions,
    shape_text,
    shown,
    special_file,
)
from .streaming import npy_layout, stream_predict


def cmd_predict(args: argparse.Namespace) -> int:

    if args.output == STREAM:  # stdout, as without -o
        args.output = None
    if args.output is not None:
        check_destination(args.output, source=(args.model, args.weights), overwrite_source=args.force)
        check_destination(args.output, source=args.input, overwrite_source=args.force)
        output_format(args.output, 1)  # a suffix predict cannot write fails before any work
    elif sys.stdout is None:
        raise MalinnError("stdout is closed: give the output file with -o")
    pool: list | None = None
    if args.device is not None and "," in args.device:  # several devices: each chunk's passes spread over them
        chosen = set_device([spec.strip() for spec in args.device.split(",")])
        pool = chosen if isinstance(chosen, list) else [chosen]
        device = pool[0]
    else:
        device = device_of(args)
    model = load_model(args.model, weights=args.weights, precision=args.precision)
    outputs = getattr(model, "outputs", None) or [None]
    form = output_format(args.output, len(outputs))
    shown_on = device.name if pool is None else f"{len(pool)} devices ({', '.join(d.name for d in pool)})"
    layout = None
    if (
        args.output is not None
        and form == "npy"
        and not special_file(args.output)
        and args.key is None
        and len(model.input_shapes) == 1
        and len(outputs) == 1
        and Path(args.input).suffix.lower() == ".npy"
    ):
        layout = npy_layout(args.input)
    if layout is not None:  # .npy to .npy: in chunks, in bounded memory, whatever the input's size
        shapes = stream_predict(
            model,
            args.input,
            args.output,
            layout,
            args.batch_size,
            devices=pool,
            source=args.input,
            overwrite_source=args.force,
        )
        report(
            f"{shown(args.model, args.weights)} on {shown_on}: {shapes[0]} -> {shapes[1]} written to {args.output}",
            report_stream(args.output),
            str(args.output),
        )
        return 0
    x = read_inputs(model, args.input, args.key)
    y = named_outputs(model, model.predict(x, batch_size=args.batch_size, verbose=0, devices=pool))
    output_name = getattr(outputs[0], "name", None) or model.layers[-1].name
    if args.output is not None:
        write_file(args.output, save_predictions(y, form, output_name), source=args.input, overwrite_source=args.force)
        where = str(args.output)
    elif sys.stdout.isatty():
        for name, out in y.items() if isinstance(y, dict) else [(None, y)]:
            if name is not None:
                print(f"output {name}:")
            print_table(out)
        where = "the terminal"
    else:
        write_stdout(save_predictions(y, form))
        where = "stdout (.npz)" if isinstance(y, dict) else "stdout (.npy)"
    report(
        f"{shown(args.model, args.weights)} on {shown_on}: {shape_text(x)} -> {shape_text(y)} written to {where}",
        report_stream(args.output),
        where,
    )
    return 0
