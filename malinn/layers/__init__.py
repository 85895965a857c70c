"""Layers: the Keras-shaped building blocks of a malinn model."""

from .activation import Activation
from .base import Layer
from .dense import Dense

__all__ = ["Layer", "Dense", "Activation"]
