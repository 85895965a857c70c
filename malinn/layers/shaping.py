"""Layers that change no values on the device: ``Flatten``."""

from __future__ import annotations

from .base import Layer

__all__ = ["Flatten"]


class Flatten(Layer):
    """Flattens each sample to one feature axis, as Keras's ``Flatten`` (channels last).

    malinn keeps every activation as features x batch, so a model whose input has several axes
    is flattened once on the host (row-major, as Keras does) before the upload; the layer itself
    then moves nothing.
    """

    flattens = True

    def call(self, inputs):
        return inputs
