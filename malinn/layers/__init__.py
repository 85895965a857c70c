"""Layers: the Keras-shaped building blocks of a malinn model."""

from .activation import ELU, Activation, LeakyReLU, ReLU, Softmax
from .base import Layer
from .convolution import Conv1D, Conv2D, DepthwiseConv2D, SeparableConv2D
from .dense import Dense
from .normalization import BatchNormalization
from .pooling import (AveragePooling1D, AveragePooling2D, GlobalAveragePooling1D, GlobalAveragePooling2D,
                      GlobalMaxPooling1D, GlobalMaxPooling2D, MaxPooling1D, MaxPooling2D)
from .shaping import Flatten
from .spatial import Cropping1D, Cropping2D, UpSampling1D, UpSampling2D, ZeroPadding1D, ZeroPadding2D

__all__ = ["Layer", "Dense", "Activation", "ReLU", "LeakyReLU", "ELU", "Softmax", "BatchNormalization", "Flatten",
           "Conv1D", "Conv2D", "DepthwiseConv2D", "SeparableConv2D",
           "MaxPooling1D", "MaxPooling2D", "AveragePooling1D", "AveragePooling2D", "GlobalMaxPooling1D",
           "GlobalMaxPooling2D", "GlobalAveragePooling1D", "GlobalAveragePooling2D",
           "ZeroPadding1D", "ZeroPadding2D", "Cropping1D", "Cropping2D", "UpSampling1D", "UpSampling2D"]
