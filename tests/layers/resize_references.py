"""numpy definitions of tf.image.resize's bicubic (half-pixel centres, Keys' cubic with a = -0.5)
and area resizes without antialiasing, as TensorFlow's ResizeBicubic and ResizeArea kernels compute
them in float32, for the tests and the Oclgrind driver."""

import numpy as np

#: TensorFlow's cubic coefficient table: the distance from a tap rounded to a multiple of 1/1024
TABLE = 1024


def _keys(a: float = -0.5):
    """The table's two columns: Keys' kernel at i / 1024 (distance 0..1) and at 1 + i / 1024 (1..2),
    computed in float64 and kept as float32, as TensorFlow's InitCoeffsTable."""
    x = (np.arange(TABLE + 1) / TABLE).astype(np.float32).astype(np.float64)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    x1 = x + 1
    far = ((a * x1 - 5 * a) * x1 + 8 * a) * x1 - 4 * a
    return near.astype(np.float32), far.astype(np.float32)


def _cubic_taps(out: int, size: int):
    """``(indices (out, 4), weights (out, 4))`` along one axis, as TensorFlow's GetWeightsAndIndices
    with Keys' cubic: taps outside the image weigh 0, the others are divided by their sum."""
    near, far = _keys()
    scale = np.float32(size) / np.float32(out)
    position = (np.arange(out, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    low = np.floor(position)
    offset = np.rint((position - low) * np.float32(TABLE)).astype(int)
    weights = np.stack([far[offset], near[offset], near[TABLE - offset], far[TABLE - offset]], axis=1)
    taps = low.astype(int)[:, None] + np.arange(-1, 3)[None, :]
    weights = np.where((taps >= 0) & (taps < size), weights, np.float32(0))
    total = weights.sum(axis=1, dtype=np.float32)
    weights = np.where(
        np.abs(total)[:, None] >= 1000 * np.finfo(np.float32).tiny, weights * (np.float32(1) / total)[:, None], weights
    )
    return np.clip(taps, 0, size - 1), weights.astype(np.float32)


def bicubic_reference(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """tf.image.resize(x, (height, width), "bicubic") of images ``x`` (batch, H, W, C), in float64
    from float32 weights (each output sums the rows of its four columns, then the columns)."""
    ys, wy = _cubic_taps(height, x.shape[1])
    xs, wx = _cubic_taps(width, x.shape[2])
    x = x.astype(np.float64)
    rows = np.einsum("nhkwc,hk->nhwc", x[:, ys], wy.astype(np.float64))  # (n, height, W, c)
    return np.einsum("nhwkc,wk->nhwc", rows[:, :, xs], wx.astype(np.float64))


def _area_matrix(out: int, size: int) -> np.ndarray:
    """(out, size) weights: the part of each input cell that output cell [o * s, (o + 1) * s) covers,
    as TensorFlow's ResizeArea (cells past the edge read the last one)."""
    scale = np.float32(size) / np.float32(out)
    matrix = np.zeros((out, size))
    for o in range(out):
        lo, hi = np.float32(o) * scale, np.float32(o + 1) * scale
        for i in range(int(np.floor(lo)), int(np.ceil(hi))):
            if i < lo:
                part = scale if i + 1 > hi else np.float32(i + 1) - lo
            else:
                part = hi - np.float32(i) if i + 1 > hi else 1.0
            matrix[o, min(max(i, 0), size - 1)] += float(part)
    return matrix


def area_reference(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """tf.image.resize(x, (height, width), "area") of images ``x`` (batch, H, W, C), in float64."""
    sy, sx = np.float32(x.shape[1]) / np.float32(height), np.float32(x.shape[2]) / np.float32(width)
    my, mx = _area_matrix(height, x.shape[1]), _area_matrix(width, x.shape[2])
    return np.einsum("hi,niwc,jw->nhjc", my, x.astype(np.float64), mx) / float(sy * sx)
