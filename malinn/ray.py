"""Scoring data sets on a Ray cluster: :class:`Predictor`, a callable class for Ray Data's
``Dataset.map_batches``, one model per actor (``pip install 'malinn[ray]'``)::

    import ray
    from malinn.ray import Predictor

    ds = ray.data.read_parquet("s3://bucket/features/")
    scored = ds.map_batches(Predictor, fn_constructor_kwargs={"model": "model.malinn"},
                            batch_size=8192, num_gpus=1, compute=ray.data.ActorPoolStrategy(size=8))
    scored.write_parquet("s3://bucket/scores/")

Ray starts the actors (each a process of its own: one model, its plans and its device), hands
each batches of rows as numpy columns, and gathers what they return. With ``num_gpus=1`` an actor
runs on the GPU Ray assigned it; without, on the node's default device (``MALINN_DEVICE``, else
the first GPU, else the CPU). docs/SCALING.md shows a whole job.

Ray is imported only here, and only when a :class:`Predictor` is made (an optional dependency).
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import numpy as np

from .backends.base import Device
from .backends.selection import devices as working_devices
from .backends.selection import listing, resolve_devices
from .errors import DeviceError
from .model.model import PlannedModel
from .model.saving import load_model

__all__ = ["Predictor", "RAY_HINT", "actor_devices"]

#: what a Predictor says where Ray is not installed
RAY_HINT = "malinn.ray needs Ray Data, which is not installed: pip install 'malinn[ray]'"


def _ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise ImportError(RAY_HINT) from None
    return ray


def actor_devices(gpu_ids: list) -> list | None:
    """The malinn devices of the GPUs Ray assigned to an actor (``ray.get_gpu_ids()``), or None
    where it assigned none (``predict``'s default device then).

    Ray sets ``CUDA_VISIBLE_DEVICES`` to the assigned GPUs; a driver that honours it (NVIDIA's
    OpenCL) shows exactly those, which are then taken in order; one that does not shows every
    GPU of the node, and the assigned ids index them.

    Raises:
        DeviceError: an id does not name one of the GPUs malinn finds here (the message lists them).
    """
    if not gpu_ids:
        return None
    found = working_devices()
    gpus = [d for d in found if d.kind == "gpu" and d.backend == "opencl"] or [d for d in found if d.kind == "gpu"]
    if len(gpus) == len(gpu_ids):
        return gpus
    try:
        return [gpus[int(i)] for i in gpu_ids]
    except (ValueError, IndexError):
        raise DeviceError(
            f"Ray assigned GPU(s) {', '.join(map(str, gpu_ids))} to this actor, but malinn finds "
            f"{len(gpus)} GPU(s) here ({listing(gpus)}); name the device (Predictor(..., device=...))"
        ) from None


def _column(batch: Any, name: str) -> np.ndarray:
    """Column ``name`` of a batch (a dict of numpy arrays, or a pandas DataFrame) as one array, its
    rows stacked where each row holds an array (a Parquet list column).

    Raises:
        KeyError: the batch has no such column (the message lists those it has).
        ValueError: its rows are arrays of different shapes.
    """
    try:
        column = batch[name]
    except KeyError:
        raise KeyError(
            f"malinn.ray.Predictor: the batch has no column {name!r}; it has {', '.join(map(str, batch.keys()))}"
        ) from None
    column = column.to_numpy() if hasattr(column, "to_numpy") else np.asarray(column)
    if column.dtype == object:
        rows = [np.asarray(row) for row in column]
        try:
            column = np.stack(rows) if rows else column.astype(np.float32)
        except ValueError:  # rows of different shapes: which ones, named (numpy's message names neither)
            shapes = sorted({row.shape for row in rows})
            if len(shapes) < 2:
                raise
            raise ValueError(
                f"malinn.ray.Predictor: column {name!r} holds rows of different shapes "
                f"({', '.join(map(str, shapes[:4]))}{', ...' if len(shapes) > 4 else ''})"
            ) from None
    return column


class Predictor:
    """A model that scores Ray Data batches: ``ds.map_batches(Predictor, fn_constructor_kwargs=...)``.

    Ray makes one per actor; ``__init__`` loads the model (from a file, or a model object Ray sent
    pickled: its config and weights) and chooses the actor's device; each call predicts one batch.

    Args:
        model: a malinn model file or a Keras file (``.keras``, ``.h5``), read by each actor from
            its own file system (a path every node sees); or a malinn model object.
        input_column: the column holding the model's input (one row per sample; a Parquet list
            column is stacked into an array); for a model of several inputs, a list of columns in
            input order.
        output_column: the column the predictions go to; a model of several outputs writes
            ``{output_column}_{i}`` (by output name where the model names them).
        device: what :func:`malinn.set_device` takes (a list: the actor spreads each batch over
            those devices); default: the GPUs Ray assigned the actor (``num_gpus=1`` in
            ``map_batches``), else the node's default device.
        batch_size: samples per device pass (default: each batch Ray hands over in one pass; its
            size is ``map_batches``'s ``batch_size``).

    Raises:
        ImportError: Ray is not installed (``pip install 'malinn[ray]'``).
        DeviceError: the device named, or the GPU Ray assigned, is not one malinn finds.
        MalinnError: the model file cannot be read.
    """

    def __init__(
        self,
        model: PlannedModel | str | os.PathLike,
        input_column: str | list[str] | tuple[str, ...] = "data",
        output_column: str = "predictions",
        device: str | Device | list | tuple | None = None,
        batch_size: int | None = None,
    ):
        ray = _ray()
        self.devices: list | None
        if device is not None:
            self.devices = resolve_devices(device)
        else:
            # outside a Ray worker or driver, none assigned (get_gpu_ids would start a local Ray)
            gpu_ids = ray.get_gpu_ids() if ray.is_initialized() else []
            self.devices = actor_devices(list(gpu_ids))
        self.model = model if isinstance(model, PlannedModel) else load_model(model)
        self.input_column, self.output_column, self.batch_size = input_column, output_column, batch_size

    def __call__(self, batch: Any) -> Any:
        """Predicts one batch.

        Args:
            batch: a dict of numpy arrays by column (Ray Data's ``batch_format="numpy"``, the
                default) or a pandas DataFrame.

        Returns:
            The batch without the input column(s), with the predictions' column(s) added (float32,
            one row per sample): keys and labels pass through beside their scores.

        Raises:
            KeyError: an input column is missing.
            ValueError: an input column's rows do not fit the model (the message names the column,
                the layer and the shapes).
        """
        names = self.input_column if isinstance(self.input_column, (list, tuple)) else [self.input_column]
        arrays = [_column(batch, name) for name in names]
        x = arrays if isinstance(self.input_column, (list, tuple)) else arrays[0]
        try:
            y = self.model.predict(x, batch_size=self.batch_size, verbose=0, devices=self.devices)
        except ValueError as exc:  # the input's shape or kind: which column gave it
            raise ValueError(f"malinn.ray.Predictor, column(s) {', '.join(map(repr, names))}: {exc}") from None
        if isinstance(y, dict):
            outputs = {f"{self.output_column}_{name}": value for name, value in y.items()}
        elif isinstance(y, list):
            outputs = {f"{self.output_column}_{i}": value for i, value in enumerate(y)}
        else:
            outputs = {self.output_column: y}
        if hasattr(batch, "drop"):  # a pandas DataFrame: a column of rows
            scored = batch.drop(columns=names)
            for name, value in outputs.items():
                scored[name] = list(value) if value.ndim > 1 else value
            return scored
        scored = {key: value for key, value in batch.items() if key not in names}
        scored.update(outputs)
        return scored
