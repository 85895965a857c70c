"""What ``malinn serve`` serves and how: the models, their versions, batching, limits.

The settings come from the command line and, for several models, from a config file: TensorFlow
Serving's own (its model config in protocol buffers' text format, :mod:`malinn.serve.text_format`,
with its batching parameters in a file of their own, ``--batching-parameters-file``), or the same
keys in JSON (``docs/SERVING.md``)::

    {"model_config_list": [
        {"name": "digits", "base_path": "/srv/models/digits",
         "model_version_policy": {"latest": {"num_versions": 1}}, "version_labels": {"stable": 1},
         "batching_parameters": {"max_batch_size": 16}}],
     "batching_parameters": {"max_batch_size": 32, "batch_timeout_micros": 0, "max_enqueued_batches": 16},
     "parse_workers": 4}

A model's ``base_path`` is a model file (served as version 1) or a folder of version folders
(``1/``, ``2/``... each holding one model file), watched for new versions as TensorFlow Serving
watches its base paths.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from .text_format import TextFormatError, read_text_format

__all__ = [
    "BatchingParameters",
    "ModelConfig",
    "ServeConfig",
    "ConfigError",
    "MODEL_SUFFIXES",
    "ConfigFile",
    "model_arg",
    "read_config_file",
    "read_batching_file",
    "default_parse_workers",
    "PARSE_WORKER_MIN_BYTES",
    "ENCODE_WORKER_MIN_VALUES",
    "ENCODE_WORKER_MIN_VALUES_ORJSON",
]

#: the files a version folder may hold as its model (the first found, in this order)
MODEL_SUFFIXES = (".malinn", ".keras", ".h5")

#: bodies of this many bytes or more go to the parse workers, smaller ones are parsed in the event
#: loop: sending a body and its arrays between processes costs the server's process about 0.2 ms
#: of its own, which is what Python's json takes to read a 13 KB body (benchmarks/serve.py's
#: request_path; orjson, where installed, reads bodies 3 to 11 times faster, so the trip pays for
#: larger bodies only there)
PARSE_WORKER_MIN_BYTES = 32 * 1024

#: answers of this many numbers or more are written as JSON in a parse worker where the server has
#: them: a number costs about 0.7 us to write (Python's float repr), the trip about 0.2 ms
ENCODE_WORKER_MIN_VALUES = 512

#: the same where orjson writes the answers (installed with the serve extra): a number costs about
#: 0.14 us there, so only answers of some thousands of numbers repay the trip
ENCODE_WORKER_MIN_VALUES_ORJSON = 4096


def default_parse_workers() -> int:
    """The parse workers ``malinn serve`` starts by default: half the cores this process may use,
    at most 8 (the event loop, the batchers and the device's driver keep the others); 0 on one core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(8, cores // 2)


class ConfigError(ValueError):
    """A config file or command-line model that cannot be served as given; the message names it."""


@dataclass(frozen=True)
class BatchingParameters:
    """How concurrent requests to one model version are merged into one predict call.

    Attributes:
        enabled: merge requests (False: each request is its own predict call, in arrival order).
        max_batch_size: the most samples one predict call runs; a request of more runs alone, in
            calls of this size.
        batch_timeout_micros: how long the first request of a batch waits for others (0: a batch is
            whatever is queued when the model is free, the least latency).
        max_enqueued_batches: the queue holds at most ``max_enqueued_batches * max_batch_size``
            samples (batching or not); a request beyond is answered 503.
        allowed_batch_sizes: the batch sizes a call is padded up to (each is a plan of its own, made
            at load time); empty: powers of two up to ``max_batch_size``.
    """

    enabled: bool = True
    max_batch_size: int = 32
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = 16
    allowed_batch_sizes: tuple = ()

    def sizes(self) -> tuple:
        """The padded batch sizes, ascending (``(1,)`` without batching)."""
        if not self.enabled:
            return (1,)
        if self.allowed_batch_sizes:
            return tuple(self.allowed_batch_sizes)
        sizes, size = [], 1
        while size < self.max_batch_size:
            sizes.append(size)
            size *= 2
        return tuple(sizes + [self.max_batch_size])

    @property
    def batch_limit(self) -> int:
        """The most samples one call runs (1 without batching)."""
        return self.max_batch_size if self.enabled else 1

    @property
    def queue_capacity(self) -> int:
        """The most samples the queue holds (batching or not)."""
        return self.max_enqueued_batches * self.max_batch_size

    def checked(self, where: str, names: dict | None = None) -> "BatchingParameters":
        """These parameters, or a ConfigError naming ``where`` and the value out of range, each
        parameter called as ``names`` calls it (the command line's flags), else by its key."""

        def called(key: str) -> str:
            return (names or {}).get(key, key)

        for name in ("max_batch_size", "max_enqueued_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where}: {called(name)} must be a positive integer, got {value!r}")
        value = self.batch_timeout_micros
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{where}: {called('batch_timeout_micros')} must be an integer >= 0, got {value!r}")
        sizes = self.allowed_batch_sizes
        if sizes:
            if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes) or list(sizes) != sorted(
                set(sizes)
            ):
                raise ConfigError(
                    f"{where}: {called('allowed_batch_sizes')} must be positive integers in increasing order, "
                    f"got {list(sizes)}"
                )
            if sizes[-1] != self.max_batch_size:
                raise ConfigError(
                    f"{where}: the last of {called('allowed_batch_sizes')} ({sizes[-1]}) must equal "
                    f"{called('max_batch_size')} ({self.max_batch_size}), as TensorFlow Serving requires"
                )
        return self

    def updated(self, values: dict, where: str) -> "BatchingParameters":
        """These parameters with ``values`` (a config file's ``batching_parameters``) over them."""
        if not isinstance(values, dict):
            raise ConfigError(f"{where}: batching_parameters must be an object, got {type(values).__name__}")
        known = {"enabled", "max_batch_size", "batch_timeout_micros", "max_enqueued_batches", "allowed_batch_sizes"}
        unknown = sorted(set(values) - known - set(ACCEPTED_BATCHING))
        if unknown:
            raise ConfigError(
                f"{where}: unknown batching parameter(s) {', '.join(unknown)} "
                f"(known: {', '.join(sorted(known | set(ACCEPTED_BATCHING)))})"
            )
        values = {k: _unwrapped(v) for k, v in values.items()}
        for name, meaning in ACCEPTED_BATCHING.items():
            if name in values:  # checked, then left: what it sets is fixed here
                value = values.pop(name)
                if isinstance(value, bool) != (name == "pad_variable_length_inputs") or (
                    name == "num_batch_threads" and not (isinstance(value, int) and value >= 1)
                ):
                    raise ConfigError(f"{where}: {name} must be {meaning}, got {value!r}")
        if "allowed_batch_sizes" in values:
            if not isinstance(values["allowed_batch_sizes"], list):
                raise ConfigError(f"{where}: allowed_batch_sizes must be a list of integers")
            values["allowed_batch_sizes"] = tuple(values["allowed_batch_sizes"])
        if "enabled" in values and not isinstance(values["enabled"], bool):
            raise ConfigError(f"{where}: enabled must be true or false, got {values['enabled']!r}")
        updated = replace(self, **values)
        inherited = updated.allowed_batch_sizes
        if "allowed_batch_sizes" not in values and inherited and inherited[-1] != updated.max_batch_size:
            raise ConfigError(
                f"{where}: max_batch_size {updated.max_batch_size} does not end the allowed_batch_sizes "
                f"{list(inherited)} it inherits (from the file's batching_parameters or --allowed-batch-sizes); "
                f"give it its own allowed_batch_sizes, the last equal to max_batch_size"
            )
        return updated.checked(where)


#: TensorFlow Serving's batching parameters that a file of theirs may give and that malinn checks and
#: leaves, by what each must be: one thread batches each model version (its device runs one call at
#: a time), and every input has a fixed shape (nothing to pad)
ACCEPTED_BATCHING = {"num_batch_threads": "a positive integer", "pad_variable_length_inputs": "true or false"}


def _unwrapped(value: Any) -> Any:
    """TensorFlow Serving's text config wraps numbers as ``{"value": 32}``: either form is taken."""
    return value["value"] if isinstance(value, dict) and set(value) == {"value"} else value


@dataclass(frozen=True)
class ModelConfig:
    """One served model.

    Attributes:
        name: the name in ``/v1/models/{name}``.
        base_path: a model file (version 1) or a folder of version folders.
        policy: ``("latest", n)``, ``("all", None)`` or ``("specific", (v, ...))``: which versions
            of a folder are served (TensorFlow Serving's model_version_policy; default the latest).
        labels: version labels (``{"stable": 1}``) for ``/v1/models/{name}/labels/{label}``.
        batching: this model's batching parameters.
        precision: the weights' precision on the device (None: the file's).
    """

    name: str
    base_path: Path
    policy: tuple = ("latest", 1)
    labels: dict = field(default_factory=dict)
    batching: BatchingParameters = BatchingParameters()
    precision: str | None = None

    @property
    def is_file(self) -> bool:
        return self.base_path.is_file()


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``malinn serve`` runs with.

    Attributes:
        models: the served models.
        host, port: where the REST API listens (port 0: a free port, printed at start).
        poll_seconds: how often model folders are looked at for new versions (0: never).
        max_request_bytes: the largest request body (413 beyond).
        request_timeout: seconds a predict may take from its arrival, queue included (504 beyond).
        max_connections: connections served at once (503 beyond).
        log_requests: one JSON line per request on stdout.
        warmup: run each padded batch size once at load, so the first requests plan nothing.
        parse_workers: processes parsing large request bodies in parallel (0: every body is
            parsed in the server's process).
        parse_worker_min_bytes: the smallest body sent to a parse worker.
        http_workers: HTTP front processes on the port (1: the server's own process answers HTTP;
            more: each front parses and answers, this process runs the models).
    """

    models: tuple
    host: str = "0.0.0.0"
    port: int = 8501
    poll_seconds: float = 1.0
    max_request_bytes: int = 32 * 2**20
    request_timeout: float = 30.0
    max_connections: int = 1024
    log_requests: bool = False
    warmup: bool = True
    parse_workers: int = 0
    parse_worker_min_bytes: int = PARSE_WORKER_MIN_BYTES
    http_workers: int = 1


def model_arg(text: str, batching: BatchingParameters, precision: str | None = None) -> ModelConfig:
    """A command line's ``MODEL``: ``PATH`` or ``NAME=PATH``, a model file or a folder of versions.

    Raises:
        ConfigError: the path does not exist, or the name is not a URL path segment.
    """
    name, sep, given = text.partition("=")
    if not sep or os.path.exists(text):
        name, given = "", text
    path = Path(given)
    if not path.exists():
        raise ConfigError(f"model {text!r}: no such file or folder")
    name = name or (path.stem if path.is_file() else path.resolve().name)
    return ModelConfig(name=_checked_name(name, text), base_path=path, batching=batching, precision=precision)


def _checked_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name or any(c in name for c in "/:?#%") or name.strip() != name:
        raise ConfigError(
            f"{where}: a model name must be a non-empty string without '/', ':', '?', '#', '%' "
            f"or surrounding spaces, got {name!r}"
        )
    return name


class ConfigFile(NamedTuple):
    """A config file's contents: its models, its global batching parameters (over the flags') and
    its ``parse_workers`` (None where it names none)."""

    models: tuple
    batching: BatchingParameters
    parse_workers: int | None


def read_config_file(
    path: str | os.PathLike[str], batching: BatchingParameters, precision: str | None = None
) -> ConfigFile:
    """The models, global batching parameters and parse workers of a config file: TensorFlow
    Serving's model config in protocol buffers' text format (``model_config_list { config { ... } }``)
    or the same keys in JSON.

    Paths in it are relative to the file's folder.

    Raises:
        ConfigError: the file cannot be read or parsed, or holds an unknown key or a bad value; the
            message names the file and the entry (and the line, for a text-format error).
    """
    path = Path(path)
    where = f"config file {str(path)!r}"
    data = _read(path, where, MODEL_CONFIG_REPEATED)
    for entry in _entries(data):
        if isinstance(entry, dict) and isinstance(entry.get("version_labels"), list):
            entry["version_labels"] = _labels(entry["version_labels"], where)
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected an object with model_config_list")
    known = {"model_config_list", "batching_parameters", "parse_workers"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    if "batching_parameters" in data:
        batching = batching.updated(data["batching_parameters"], where)
    workers = _unwrapped(data.get("parse_workers"))
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 0):
        raise ConfigError(f"{where}: parse_workers must be an integer >= 0, got {workers!r}")
    entries = data.get("model_config_list")
    if isinstance(entries, dict) and set(entries) == {"config"}:  # TensorFlow Serving's {"config": [...]}
        entries = entries["config"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{where}: model_config_list must be a non-empty list of models")
    models = [_model_entry(entry, i, path.parent, where, batching, precision) for i, entry in enumerate(entries)]
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: model names must be distinct, got {names}")
    return ConfigFile(tuple(models), batching, workers)


#: the repeated fields of TensorFlow Serving's model config and batching parameters (a list each,
#: however often a text-format file gives them)
MODEL_CONFIG_REPEATED = frozenset(("config", "versions", "version_labels", "allowed_batch_sizes"))


def read_batching_file(path: str | os.PathLike[str], batching: BatchingParameters) -> BatchingParameters:
    """``batching`` with a batching parameters file's values over it: TensorFlow Serving's
    ``--batching_parameters_file`` (protocol buffers' text format, ``max_batch_size { value: 32 }``),
    or the same keys in JSON.

    Raises:
        ConfigError: the file cannot be read or parsed, or holds an unknown key or a bad value; the
            message names the file (and the line, for a text-format error).
    """
    path = Path(path)
    where = f"batching parameters file {str(path)!r}"
    return batching.updated(_read(path, where, MODEL_CONFIG_REPEATED), where)


def _read(path: Path, where: str, repeated: frozenset) -> Any:
    """A config file's document: protocol buffers' text format where its first character (past
    comments and space) begins a field's name, else JSON."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{where}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where} is not text (UTF-8): {exc}") from None
    if not re.match(r"[A-Za-z_]|$", re.sub(r"(?m)^\s*#.*$", "", text).lstrip()):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"{where} is not JSON: {exc}") from None
    try:
        return read_text_format(text, repeated)
    except TextFormatError as exc:
        raise ConfigError(f"{where} is neither JSON nor protocol buffers' text format: {exc}") from None


def _entries(data: Any) -> list:
    """The model entries of a config document, as far as it has them (checked later)."""
    entries = data.get("model_config_list") if isinstance(data, dict) else None
    if isinstance(entries, dict):
        entries = entries.get("config")
    return entries if isinstance(entries, list) else []


def _labels(entries: list, where: str) -> dict:
    """A text-format file's ``version_labels { key: 'stable' value: 1 }`` entries as one mapping."""
    labels: dict = {}
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) != {"key", "value"} or not isinstance(entry["key"], str):
            raise ConfigError(f"{where}: each version_labels entry gives a key (a label) and a value (a version)")
        if entry["key"] in labels:
            raise ConfigError(f"{where}: the version label {entry['key']!r} is given twice")
        labels[entry["key"]] = entry["value"]
    return labels


def _model_entry(
    entry: Any, index: int, folder: Path, where: str, batching: BatchingParameters, precision: str | None
) -> ModelConfig:
    where = f"{where}, model_config_list[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected an object with name and base_path")
    known = {
        "name",
        "base_path",
        "model_platform",
        "model_version_policy",
        "version_labels",
        "batching_parameters",
        "precision",
    }
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    name = _checked_name(entry.get("name"), where)
    if not isinstance(entry.get("base_path"), str):
        raise ConfigError(f"{where} ({name!r}): base_path must be a path")
    base = Path(entry["base_path"])
    base = base if base.is_absolute() else folder / base
    if not base.exists():
        raise ConfigError(f"{where} ({name!r}): base_path {str(base)!r} does not exist")
    labels = entry.get("version_labels", {})
    if not isinstance(labels, dict) or any(
        isinstance(v, bool) or not isinstance(_unwrapped(v), int) for v in labels.values()
    ):
        raise ConfigError(f"{where} ({name!r}): version_labels must map labels to version numbers")
    labels = {str(k): int(_unwrapped(v)) for k, v in labels.items()}
    if "batching_parameters" in entry:
        batching = batching.updated(entry["batching_parameters"], f"{where} ({name!r})")
    if entry.get("precision") is not None:
        precision = entry["precision"]
    return ModelConfig(
        name=name,
        base_path=base,
        policy=_policy(entry.get("model_version_policy"), where),
        labels=labels,
        batching=batching,
        precision=precision,
    )


def _policy(value: Any, where: str) -> tuple:
    if value is None:
        return ("latest", 1)
    if isinstance(value, dict) and len(value) == 1:
        ((kind, args),) = value.items()
        args = args if isinstance(args, dict) else {}
        if kind == "latest":
            n = _unwrapped(args.get("num_versions", 1))
            if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
                return ("latest", n)
        elif kind == "all":
            return ("all", None)
        elif kind == "specific":
            versions = args.get("versions")
            versions = versions if isinstance(versions, list) else [versions]
            versions = [_unwrapped(v) for v in versions]
            if versions and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in versions):
                return ("specific", tuple(sorted(set(versions))))
    raise ConfigError(
        f'{where}: model_version_policy must be {{"latest": {{"num_versions": N}}}}, {{"all": {{}}}} '
        f'or {{"specific": {{"versions": [V, ...]}}}}, got {json.dumps(value)}'
    )
