"""Layers: the Keras-shaped building blocks of a malinn model."""

from .activation import ELU, Activation, LeakyReLU, PReLU, ReLU, Softmax, ThresholdedReLU
from .base import Layer
from .dense import Dense
from .normalization import BatchNormalization, LayerNormalization, UnitNormalization
from .preprocessing import Normalization, Rescaling
from .shaping import Flatten, Identity, Permute, RepeatVector, Reshape

__all__ = ["Layer", "Dense", "Activation", "ReLU", "LeakyReLU", "ELU", "ThresholdedReLU", "PReLU", "Softmax",
           "BatchNormalization", "LayerNormalization", "UnitNormalization", "Rescaling", "Normalization",
           "Flatten", "Reshape", "Permute", "RepeatVector", "Identity"]
