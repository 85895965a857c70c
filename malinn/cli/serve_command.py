"""``malinn serve``: its arguments and its run (the server itself is :mod:`malinn.serve`)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from ..backends.selection import get_device, set_device
from ..serve.config import (
    PARSE_WORKER_MIN_BYTES,
    BatchingParameters,
    ConfigError,
    ServeConfig,
    default_parse_workers,
    model_arg,
    read_batching_file,
    read_config_file,
)

__all__ = ["add_serve_command", "cmd_serve"]

#: the batching parameters the command line sets, each by the flag of its name (--max-batch-size)
BATCHING_FLAGS = ("max_batch_size", "batch_timeout_micros", "max_enqueued_batches", "allowed_batch_sizes")


def _count(text: str, least: int = 1) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"expected an integer >= {least}, got {text!r}")
    return value


def _seconds(
    text: str, least_ok: Callable[[float], bool] = lambda v: v > 0, expected: str = "a positive number of seconds"
) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and least_ok(value)):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def _port(text: str) -> int:
    value = _count(text, 0)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {text!r}")
    return value


def _sizes(text: str) -> tuple:
    try:
        sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return sizes


def add_serve_command(
    add: Callable[..., argparse.ArgumentParser], device_help: str, precisions: tuple, precision_help: str
) -> None:
    """Adds ``serve`` to the ``malinn`` command's subcommands (``add(name, help, func)`` makes one)."""
    p = add(
        "serve",
        "serve models over TensorFlow Serving's REST API (predict, status, metadata) with dynamic "
        "batching, Prometheus metrics and a graceful stop (needs the serve extra: pip install "
        "'malinn[serve]'; docs/SERVING.md)",
        cmd_serve,
    )
    p.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="a model to serve: a malinn model file or Keras file (version 1), or a folder of version "
        "folders 1/, 2/... each holding one (the latest served, new ones picked up while serving); "
        "NAME=PATH names it (default: the file's or folder's name)",
    )
    p.add_argument(
        "--model-config-file",
        metavar="FILE",
        help="a file of models: TensorFlow Serving's model config (model_config_list { config { name, "
        "base_path, model_version_policy, version_labels } }, protocol buffers' text format) or the same "
        "keys in JSON, where a model and the file may also give batching_parameters (over the flags)",
    )
    p.add_argument(
        "--batching-parameters-file",
        metavar="FILE",
        help="TensorFlow Serving's batching parameters (max_batch_size { value: 32 }, batch_timeout_micros, "
        "max_enqueued_batches, allowed_batch_sizes; num_batch_threads and pad_variable_length_inputs are "
        "checked and left), in its text format or JSON, over the batching flags",
    )
    p.add_argument("--host", default="0.0.0.0", help="the address to listen on (default 0.0.0.0: every interface)")
    p.add_argument(
        "--port", type=_port, default=8501, help="the REST API's port (default 8501; 0: a free port, printed at start)"
    )
    p.add_argument(
        "--no-batching",
        action="store_true",
        help="run each request in its own predict call instead of merging concurrent ones",
    )
    p.add_argument(
        "--max-batch-size", type=_count, default=32, help="the most samples one merged predict call runs (default 32)"
    )
    p.add_argument(
        "--batch-timeout-micros",
        type=lambda t: _count(t, 0),
        default=0,
        help="how long a batch's first request waits for others, in microseconds (default 0: a batch is "
        "what queued while the model was busy)",
    )
    p.add_argument(
        "--max-enqueued-batches",
        type=_count,
        default=16,
        help="the queue holds this many batches of samples; a request beyond is answered 503 (default 16)",
    )
    p.add_argument(
        "--allowed-batch-sizes",
        type=_sizes,
        metavar="N,N,...",
        help="the batch sizes a merged call is padded up to, the last equal to --max-batch-size (default: "
        "powers of two up to it); each is planned at load time",
    )
    p.add_argument(
        "--max-request-bytes",
        type=_count,
        default=32 * 2**20,
        help="the largest request body in bytes; larger ones are answered 413 (default 32 MiB)",
    )
    p.add_argument(
        "--request-timeout",
        type=_seconds,
        default=30.0,
        help="seconds a request may take from its arrival, its wait in the queue included; later ones "
        "are answered 504 (default 30)",
    )
    p.add_argument(
        "--max-connections",
        type=_count,
        default=1024,
        help="connections served at once; more are answered 503 (default 1024)",
    )
    p.add_argument(
        "--poll-seconds",
        type=lambda t: _seconds(t, lambda v: v >= 0, "a number of seconds >= 0"),
        default=1.0,
        help="how often model folders are looked at for new versions (default 1; 0: never)",
    )
    p.add_argument(
        "--parse-workers",
        type=lambda t: _count(t, 0),
        metavar="N",
        help="processes that parse large request bodies (JSON), and write large answers, in parallel, started "
        "with the server; "
        "the JSON parse holds Python's GIL, so without them one body is parsed at a time (default: half "
        f"the cores, at most 8: {default_parse_workers()} here, and 0 with --http-workers above 1, where a "
        "count is per front; the config file's parse_workers where it has one; 0: parse in the server's process)",
    )
    p.add_argument(
        "--parse-worker-min-bytes",
        type=lambda t: _count(t, 0),
        default=PARSE_WORKER_MIN_BYTES,
        metavar="BYTES",
        help="the smallest body sent to a parse worker; smaller ones are parsed in the server's "
        f"process, where that costs less than the trip (default {PARSE_WORKER_MIN_BYTES})",
    )
    p.add_argument(
        "--http-workers",
        type=_count,
        default=1,
        metavar="N",
        help="HTTP front processes on the port, each parsing requests and writing answers, the models run "
        "in the one process that owns the device (default 1: that process answers HTTP itself); with "
        "more than 1, --parse-workers defaults to 0 and is per front",
    )
    p.add_argument("--log-requests", action="store_true", help="print one JSON line per request on stdout")
    p.add_argument(
        "--no-warmup",
        action="store_true",
        help="do not run each padded batch size once at load (the first requests then make the plans)",
    )
    p.add_argument("--precision", choices=precisions, help=precision_help + " (default: each model file's)")
    p.add_argument("--device", help=device_help)


def cmd_serve(args: argparse.Namespace) -> int:
    """Runs ``malinn serve``; returns the exit status."""
    from ..serve.server import require_extra, serve

    require_extra()
    batching = BatchingParameters(
        enabled=not args.no_batching,
        max_batch_size=args.max_batch_size,
        batch_timeout_micros=args.batch_timeout_micros,
        max_enqueued_batches=args.max_enqueued_batches,
        allowed_batch_sizes=args.allowed_batch_sizes or (),
    ).checked("malinn serve", names={key: "--" + key.replace("_", "-") for key in BATCHING_FLAGS})
    if args.batching_parameters_file:
        batching = read_batching_file(args.batching_parameters_file, batching)
    models = [model_arg(text, batching, args.precision) for text in args.models]
    workers = args.parse_workers
    if args.model_config_file:
        listed = read_config_file(args.model_config_file, batching, args.precision)
        models += list(listed.models)
        if workers is None:
            workers = listed.parse_workers
    if not models:
        raise ConfigError("serve: give a MODEL or --model-config-file (see malinn serve --help)")
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ConfigError(f"serve: two models are named alike ({', '.join(names)}): name them with NAME=PATH")
    if args.device is not None:
        set_device(args.device)
    get_device()  # a device that does not work is said before the port opens
    config = ServeConfig(
        models=tuple(models),
        host=args.host,
        port=args.port,
        poll_seconds=args.poll_seconds,
        max_request_bytes=args.max_request_bytes,
        request_timeout=args.request_timeout,
        max_connections=args.max_connections,
        log_requests=args.log_requests,
        warmup=not args.no_warmup,
        parse_workers=(default_parse_workers() if args.http_workers == 1 else 0) if workers is None else workers,
        parse_worker_min_bytes=args.parse_worker_min_bytes,
        http_workers=args.http_workers,
    )
    return serve(config)
