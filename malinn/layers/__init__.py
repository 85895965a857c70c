"""Layers: the Keras-shaped building blocks of a malinn model."""

from .activation import ELU, Activation, LeakyReLU, PReLU, ReLU, Softmax, ThresholdedReLU
from .attention import AdditiveAttention, Attention, MultiHeadAttention
from .base import Layer
from .bidirectional import Bidirectional
from .category_encoding import CategoryEncoding
from .conv_lstm import ConvLSTM1D, ConvLSTM2D, ConvLSTM3D
from .convolution import Conv1D, Conv2D, DepthwiseConv2D, SeparableConv2D
from .convolution3d import Conv3D, Conv3DTranspose
from .convolution_transpose import Conv1DTranspose, Conv2DTranspose
from .dense import Dense
from .embedding import Embedding
from .group_normalization import GroupNormalization
from .lookup import IntegerLookup
from .mask_operations import AnyOperation, ExpandDims, LogicalAnd, LogicalOr, NotEqual, OnesLike, ZerosLike
from .masking_layer import Masking
from .merging import Add, Average, Concatenate, Dot, Maximum, Minimum, Multiply, Subtract
from .normalization import BatchNormalization, LayerNormalization, UnitNormalization
from .operators import ConstantOperation, Divide, OperatorActivation
from .pooling import (
    AveragePooling1D,
    AveragePooling2D,
    GlobalAveragePooling1D,
    GlobalAveragePooling2D,
    GlobalMaxPooling1D,
    GlobalMaxPooling2D,
    MaxPooling1D,
    MaxPooling2D,
)
from .pooling3d import AveragePooling3D, GlobalAveragePooling3D, GlobalMaxPooling3D, MaxPooling3D
from .preprocessing import Normalization, Rescaling
from .recurrent import GRU, LSTM, SimpleRNN
from .resizing import Resizing
from .scale_layers import CustomScaleLayer, LayerScale
from .shaping import Flatten, Identity, Permute, RepeatVector, Reshape
from .spatial import Cropping1D, Cropping2D, UpSampling1D, UpSampling2D, ZeroPadding1D, ZeroPadding2D
from .spatial3d import Cropping3D, UpSampling3D, ZeroPadding3D

__all__ = [
    "Layer",
    "Dense",
    "Activation",
    "ReLU",
    "LeakyReLU",
    "ELU",
    "ThresholdedReLU",
    "PReLU",
    "Softmax",
    "BatchNormalization",
    "LayerNormalization",
    "UnitNormalization",
    "Rescaling",
    "Normalization",
    "Flatten",
    "Reshape",
    "Permute",
    "RepeatVector",
    "Identity",
    "Conv1D",
    "Conv2D",
    "DepthwiseConv2D",
    "SeparableConv2D",
    "MaxPooling1D",
    "MaxPooling2D",
    "AveragePooling1D",
    "AveragePooling2D",
    "GlobalMaxPooling1D",
    "GlobalMaxPooling2D",
    "GlobalAveragePooling1D",
    "GlobalAveragePooling2D",
    "ZeroPadding1D",
    "ZeroPadding2D",
    "Cropping1D",
    "Cropping2D",
    "UpSampling1D",
    "UpSampling2D",
    "Add",
    "Subtract",
    "Multiply",
    "Average",
    "Maximum",
    "Minimum",
    "Concatenate",
    "Dot",
]
__all__ += ["Embedding", "SimpleRNN", "LSTM", "GRU"]
__all__ += ["MultiHeadAttention", "Attention", "AdditiveAttention"]
__all__ += ["Conv1DTranspose", "Conv2DTranspose", "GroupNormalization", "Resizing"]
__all__ += ["ConstantOperation", "Divide", "OperatorActivation", "LayerScale", "CustomScaleLayer"]
__all__ += ["Bidirectional"]
__all__ += ["Masking", "NotEqual", "AnyOperation", "LogicalOr", "LogicalAnd"]
__all__ += ["ExpandDims", "ZerosLike", "OnesLike"]
__all__ += ["Conv3D", "Conv3DTranspose", "MaxPooling3D", "AveragePooling3D", "GlobalMaxPooling3D"]
__all__ += ["GlobalAveragePooling3D", "ZeroPadding3D", "Cropping3D", "UpSampling3D"]
__all__ += ["ConvLSTM1D", "ConvLSTM2D", "ConvLSTM3D"]
__all__ += ["CategoryEncoding", "IntegerLookup"]
