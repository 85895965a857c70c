"""The op kinds of a plan's steps, each registered once (:data:`KINDS`), with the functions that
lower a layer into steps of that kind: a layer's ``lower(builder, x)`` calls them."""

from .attention import ATTENTION, attention
from .base import KINDS, OpKind, kind_named, register
from .conv import CONV, conv, depthwise
from .conv_lstm import CONV_LSTM_GATES, conv_lstm_gates, conv_lstm_recurrence, images_conv
from .conv_transpose import CONV_TRANSPOSE, conv_transpose
from .elementwise import ACTIVATION, AFFINE, BIAS, activation, affine, bias_and_activation
from .encoding import ENCODING, LOOKUP, category_encoding, integer_lookup
from .gather import GATHER, gather
from .layout import PERMUTE, RELAYOUT, REPEAT, RESHAPE, permute, relayout_step, repeat, reshape
from .masking import MASKING, any_not_equal
from .matmul import MATMUL, matmul
from .merge import CONCAT, DOT, MERGE, batch_dot, concat, merge
from .normalization import BROADCAST, NORMALIZE, NORMALIZE_MODES, broadcast, normalize
from .recurrent import RECURRENT, recurrence
from .resize import RESIZE, resize
from .volume import CONV3D, CONV3D_TRANSPOSE, POOL3D, SPATIAL3D, conv3d, conv3d_transpose, pool3d, spatial3d
from .window import IM2COL, POOL, SPATIAL, pool, spatial

__all__ = [
    "KINDS",
    "OpKind",
    "kind_named",
    "register",
    "MATMUL",
    "CONV",
    "BIAS",
    "ACTIVATION",
    "AFFINE",
    "RELAYOUT",
    "RESHAPE",
    "PERMUTE",
    "REPEAT",
    "MERGE",
    "CONCAT",
    "DOT",
    "BROADCAST",
    "NORMALIZE",
    "POOL",
    "SPATIAL",
    "IM2COL",
    "matmul",
    "conv",
    "depthwise",
    "activation",
    "affine",
    "bias_and_activation",
    "reshape",
    "permute",
    "repeat",
    "relayout_step",
    "merge",
    "concat",
    "batch_dot",
    "broadcast",
    "normalize",
    "NORMALIZE_MODES",
    "pool",
    "spatial",
]
__all__ += ["GATHER", "gather", "RECURRENT", "recurrence"]
__all__ += ["ATTENTION", "attention"]
__all__ += ["MASKING", "any_not_equal"]
__all__ += ["CONV_TRANSPOSE", "conv_transpose", "RESIZE", "resize"]
__all__ += ["CONV3D", "CONV3D_TRANSPOSE", "POOL3D", "SPATIAL3D", "conv3d", "conv3d_transpose", "pool3d", "spatial3d"]
__all__ += ["CONV_LSTM_GATES", "conv_lstm_gates", "conv_lstm_recurrence", "images_conv"]
__all__ += ["ENCODING", "LOOKUP", "category_encoding", "integer_lookup"]
