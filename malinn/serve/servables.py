"""The served models and their versions: loading, warming, the switch to a new version, unloading.

A model's versions come from its ``base_path``: a model file is version 1; a folder holds version
folders (``1/``, ``2/``...), each with one model file (``.malinn``, ``.keras`` or ``.h5``), and
is looked at every ``poll_seconds``. A new version is loaded beside the old ones (its plans for
every allowed batch size made, so that its first requests plan nothing), then made AVAILABLE in one
step: from then on a request without a version goes to it. Only then are the versions the policy
no longer serves unloaded: they stop taking requests, answer those they queued, and end. A version
that fails to load is retried when its folder's file changes.

The version states are TensorFlow Serving's: LOADING, AVAILABLE, UNLOADING, END.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from ..model.saving import load_model
from .batcher import Batcher
from .config import MODEL_SUFFIXES, ModelConfig, ServeConfig
from .metrics import Metrics
from .signature import Signature
from .version_table import ModelVersion, NotFound, ServedModel, VersionTable

__all__ = ["ModelManager", "ModelVersion", "NotFound"]


def _stamp(path: Path) -> tuple:
    try:
        st = path.stat()
        return (st.st_size, st.st_mtime_ns)
    except OSError:
        return (None, None)


def versions_on_disk(config: ModelConfig) -> dict[int, Path]:
    """``{version: model file}`` of a model's base path (a file: ``{1: file}``)."""
    base = config.base_path
    if base.is_file():
        return {1: base}
    found: dict[int, Path] = {}
    try:
        entries = list(os.scandir(base))
    except OSError:
        return found
    for entry in entries:
        if not (entry.name.isdigit() and entry.is_dir()):
            continue
        folder = Path(entry.path)
        files = (
            sorted(p for p in folder.iterdir() if p.suffix in MODEL_SUFFIXES and p.is_file()) if folder.is_dir() else []
        )
        files.sort(key=lambda p: MODEL_SUFFIXES.index(p.suffix))
        if files:
            found[int(entry.name)] = files[0]
    return found


def wanted(policy: tuple, numbers: Iterable[int]) -> set[int]:
    """The versions of ``numbers`` a model_version_policy serves."""
    ordered = sorted(numbers)
    kind, arg = policy
    if kind == "latest":
        return set(ordered[-arg:])
    if kind == "all":
        return set(ordered)
    return set(ordered) & set(arg)


class ModelManager(VersionTable):
    """Every served model: finds, loads, switches and unloads their versions, and answers which
    version serves a request (:class:`~malinn.serve.version_table.VersionTable`).

    Args:
        config: the server's configuration.
        metrics: where the batches are counted.
        say: prints a line of news (loads, switches, failures) on stderr.
    """

    def __init__(self, config: ServeConfig, metrics: Metrics, say: Callable[[str], None] | None = None):
        super().__init__(config.models)
        self.config, self.metrics = config, metrics
        self._stop = threading.Event()
        self.initial = threading.Event()  # set once the first loads are done (failed or not)
        self.failed: list = []  # the first loads' errors
        self.stopping = False
        self._say = say or (lambda text: print(f"malinn: {text}", file=sys.stderr, flush=True))
        self._thread = threading.Thread(target=self._watch, name="malinn-serve loader", daemon=True)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Loads every model's versions in the background (``initial`` is set when done), then looks
        for new versions every ``poll_seconds``."""
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stops looking for versions and ends every version's worker, answering what is queued."""
        self.stopping = True
        self._stop.set()
        if self._thread.ident is not None:  # started (a failed start stops a manager that never was)
            self._thread.join(timeout)
        for served in self.models.values():
            for version in list(served.versions.values()):
                if version.batcher is not None:
                    version.batcher.stop(timeout)

    @property
    def ready(self) -> bool:
        """Whether every model has an AVAILABLE version and the server is not stopping."""
        with self._lock:
            return (
                self.initial.is_set()
                and not self.stopping
                and all(served.available() for served in self.models.values())
            )

    def _watch(self) -> None:
        try:
            for served in self.models.values():
                self.failed += self._sync(served)
            if not self.failed:
                for served in self.models.values():
                    self.failed += self._unavailable_labels(served)
        except Exception as exc:  # a bug here must not leave the server waiting for ever
            self.failed.append(f"unexpected {type(exc).__name__}: {exc}")
        finally:
            self.initial.set()
        if self.failed:
            return
        poll = self.config.poll_seconds
        while poll > 0 and not self._stop.wait(poll):
            for served in self.models.values():
                if not served.config.is_file and not self._stop.is_set():
                    try:
                        for error in self._sync(served):
                            self._say(f"error: {error} (still serving the versions loaded before)")
                    except Exception as exc:
                        self._say(
                            f"warning: model {served.name!r}: unexpected {type(exc).__name__} while looking "
                            f"for versions: {exc}"
                        )

    # ------------------------------------------------------------------ versions
    def _unavailable_labels(self, served: ServedModel) -> list[str]:
        """A refusal for each version label of ``served`` that names a version not AVAILABLE after
        the first loads: TensorFlow Serving refuses to assign such a label (unless told to allow
        it), so a config file that names one stops the server instead of answering 404 later."""
        with self._lock:
            available = sorted(n for n, v in served.versions.items() if v.state == "AVAILABLE")
        return [
            f"model {served.name!r}: version label {label!r} names version {number}, which is not available "
            f"(available: {', '.join(map(str, available)) or 'none'}); a label names a version the policy loads"
            for label, number in sorted(served.config.labels.items())
            if number not in available
        ]

    def _sync(self, served: ServedModel) -> list[str]:
        """Loads the versions the policy wants and are not loaded, then unloads those it no longer
        wants (once one it wants is AVAILABLE); returns the load errors."""
        on_disk = versions_on_disk(served.config)
        want = wanted(served.config.policy, on_disk)
        errors: list[str] = []
        if not on_disk:
            errors.append(
                f"model {served.name!r}: no version found in {str(served.config.base_path)!r} (a model "
                f"file, or version folders 1/, 2/... holding one {'/'.join(MODEL_SUFFIXES)} file)"
            )
        for number in sorted(want, reverse=True):
            known = served.versions.get(number)
            if known is not None and (
                known.state in ("LOADING", "AVAILABLE") or (known.error and known.stamp == _stamp(on_disk[number]))
            ):
                continue
            error = self._load(served, number, on_disk[number])
            if error:
                errors.append(error)
        if any(served.versions[n].state == "AVAILABLE" for n in want if n in served.versions):
            for version in list(served.versions.values()):
                if version.state == "AVAILABLE" and version.number not in want:
                    self._unload(version)
        return errors

    def _load(self, served: ServedModel, number: int, path: Path) -> str:
        version = ModelVersion(served.name, number, path)
        version.stamp = _stamp(path)
        with self._lock:
            served.versions[number] = version
        started = time.monotonic()
        try:
            model = load_model(path, precision=served.config.precision)
            signature = Signature(model)
            batching = served.config.batching
            if self.config.warmup:
                for size in batching.sizes():
                    model.predict(
                        signature.model_input([np.zeros((size,) + s.shape, np.float32) for s in signature.inputs])
                    )
        except Exception as exc:
            version.state, version.error = "END", f"{type(exc).__name__}: {exc}"
            return f"model {served.name!r} version {number} ({path}) failed to load: {version.error}"
        label = f"{served.name}/{number}"

        def predict(arrays: list) -> list:
            return signature.output_arrays(model.predict(signature.model_input(arrays)))

        def observe(samples: int, padded: int, seconds: float) -> None:
            self.metrics.observe("malinn_serve_batch_size", (served.name, str(number)), samples)
            self.metrics.observe("malinn_serve_compute_latency_seconds", (served.name, str(number)), seconds)
            if padded > samples:
                self.metrics.count("malinn_serve_padded_samples_total", (served.name, str(number)), padded - samples)

        batcher = Batcher(predict, batching, label, observe)
        with self._lock:  # one step: from here a request without a version may go to it
            version.model, version.signature, version.batcher = model, signature, batcher
            version.state = "AVAILABLE"
        self._say(
            f"model {served.name!r} version {number} is available ({path}, {time.monotonic() - started:.1f} s "
            f"to load{' and warm up' if self.config.warmup else ''})"
        )
        return ""

    def _unload(self, version: ModelVersion) -> None:
        with self._lock:  # no new request goes to it from here
            version.state = "UNLOADING"
        if version.batcher is not None:  # an AVAILABLE version has one
            version.batcher.stop()  # answers what it queued
        with self._lock:
            version.state, version.model, version.batcher = "END", None, None
        self._say(f"model {version.name!r} version {version.number} is unloaded")

    def gauges(self) -> list:
        """The queue depth of each AVAILABLE version and the versions by state, for the metrics."""
        depth: dict[tuple[str, str], int] = {}
        states: dict[tuple[str, str], int] = {}
        with self._lock:
            for served in self.models.values():
                for v in served.versions.values():
                    states[(served.name, v.state)] = states.get((served.name, v.state), 0) + 1
                    if v.batcher is not None:
                        depth[(served.name, str(v.number))] = v.batcher.depth()
        return [
            ("malinn_serve_queue_depth", "Requests waiting for their batch.", ("model", "version"), depth),
            ("malinn_serve_model_versions", "Model versions by state.", ("model", "state"), states),
        ]
