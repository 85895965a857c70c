"""Layers: the Keras-shaped building blocks of a malinn model."""

from .activation import ELU, Activation, LeakyReLU, ReLU, Softmax
from .base import Layer
from .convolution import Conv1D, Conv2D, DepthwiseConv2D, SeparableConv2D
from .dense import Dense
from .normalization import BatchNormalization
from .shaping import Flatten

__all__ = ["Layer", "Dense", "Activation", "ReLU", "LeakyReLU", "ELU", "Softmax", "BatchNormalization", "Flatten",
           "Conv1D", "Conv2D", "DepthwiseConv2D", "SeparableConv2D"]
