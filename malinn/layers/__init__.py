"""Layers: the Keras-shaped building blocks of a malinn model."""

from .activation import ELU, Activation, LeakyReLU, ReLU, Softmax
from .base import Layer
from .dense import Dense
from .merging import Add, Average, Concatenate, Dot, Maximum, Minimum, Multiply, Subtract
from .normalization import BatchNormalization
from .shaping import Flatten

__all__ = ["Layer", "Dense", "Activation", "ReLU", "LeakyReLU", "ELU", "Softmax", "BatchNormalization", "Flatten",
           "Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum", "Concatenate", "Dot"]
