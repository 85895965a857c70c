"""The served models' versions as a table: which version answers a request, and their statuses.

The process that owns the device keeps the versions (:class:`~malinn.serve.servables.ModelManager`
loads, switches and unloads them); an HTTP front process (``--http-workers``) keeps a copy of the
table, sent by the owner whenever a version's state changes, and answers status requests and picks
a request's version from it without asking. Both answer with :class:`VersionTable`'s code, so the
answers and the 404 messages are the same.

The version states are TensorFlow Serving's: LOADING, AVAILABLE, UNLOADING, END.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .batcher import Batcher
    from .signature import Signature

__all__ = ["NotFound", "ModelVersion", "ServedModel", "VersionTable"]


class NotFound(LookupError):
    """No AVAILABLE version answers the request (404, TensorFlow Serving's NOT_FOUND)."""


class ModelVersion:
    """One version of a served model: its file, state and, once AVAILABLE, signature (and, in the
    process that owns the device, its model and batcher)."""

    def __init__(self, name: str, number: int, path: object = None):
        self.name, self.number, self.path = name, number, path
        self.state, self.error = "LOADING", ""
        self.model: Any = None  # a loaded malinn model (load_model's)
        self.signature: Signature | None = None
        self.batcher: Batcher | None = None
        self.stamp: tuple = (None, None)

    def status(self) -> dict:
        """TensorFlow Serving's ModelVersionStatus as JSON."""
        return {
            "version": str(self.number),
            "state": self.state,
            "status": {"error_code": "UNKNOWN" if self.error else "OK", "error_message": self.error},
        }


class ServedModel:
    """A model name, its config and its versions."""

    def __init__(self, config):
        self.config, self.versions = config, {}

    @property
    def name(self) -> str:
        return self.config.name

    def available(self) -> list:
        return sorted((v for v in self.versions.values() if v.state == "AVAILABLE"), key=lambda v: v.number)


class VersionTable:
    """Every served model's versions (``models``: ``{name: ServedModel}``, guarded by ``_lock``)."""

    def __init__(self, configs):
        self.models = {m.name: ServedModel(m) for m in configs}
        self._lock = threading.Lock()

    def resolve(self, name: str, version: int | None = None, label: str | None = None) -> ModelVersion:
        """The AVAILABLE version answering a request for ``name`` (the latest, or the one given by
        number or label).

        Raises:
            NotFound: no such model, version or label, or the version is not AVAILABLE.
        """
        served = self.models.get(name)
        if served is None:
            raise NotFound(
                f"Servable not found for request: Latest({name}) (served models: {', '.join(sorted(self.models))})"
            )
        if label is not None:
            if label not in served.config.labels:
                raise NotFound(
                    f"Unrecognized servable version label: {label} (model {name!r} has "
                    f"{', '.join(sorted(served.config.labels)) or 'none'})"
                )
            version = served.config.labels[label]
        with self._lock:
            if version is None:
                available = served.available()
                if not available:
                    raise NotFound(f"Servable not found for request: Latest({name}) (no version is AVAILABLE yet)")
                return available[-1]
            found = served.versions.get(version)
            if found is None or found.state != "AVAILABLE":
                raise NotFound(
                    f"Servable not found for request: Specific({name}, {version})"
                    f"{' (it is ' + found.state + ')' if found is not None else ''}"
                )
            return found

    def statuses(self, name: str, version: int | None = None, label: str | None = None) -> list:
        """The ModelVersionStatus of every version of ``name`` (or of the one given), newest first.

        Raises:
            NotFound: no such model, or no such version or label.
        """
        served = self.models.get(name)
        if served is None:
            raise NotFound(f"Could not find any versions of model {name}")
        if label is not None:
            if label not in served.config.labels:
                raise NotFound(f"Unrecognized servable version label: {label}")
            version = served.config.labels[label]
        with self._lock:
            versions = sorted(served.versions.values(), key=lambda v: -v.number)
            if version is not None:
                versions = [v for v in versions if v.number == version]
                if not versions:
                    raise NotFound(f"Could not find version {version} of model {name}")
            if not versions:
                raise NotFound(f"Could not find any versions of model {name}")
            return [v.status() for v in versions]

    def snapshot(self) -> dict:
        """The table as a front process keeps it: ``{name: [(number, state, error, signature)]}``."""
        with self._lock:
            return {
                name: [
                    (v.number, v.state, v.error, v.signature if v.state == "AVAILABLE" else None)
                    for v in served.versions.values()
                ]
                for name, served in self.models.items()
            }

    def update(self, snapshot: dict) -> None:
        """Takes the versions of a :meth:`snapshot` (a front process's copy)."""
        with self._lock:
            for name, rows in snapshot.items():
                served = self.models.get(name)
                if served is None:
                    continue
                versions = {}
                for number, state, error, signature in rows:
                    version = ModelVersion(name, number)
                    version.state, version.error, version.signature = state, error, signature
                    versions[number] = version
                served.versions = versions
