"""Keras's ConvLSTM1D / ConvLSTM2D / ConvLSTM3D in numpy (float64), channels last, as keras/src/layers/rnn/conv_lstm.py
computes them: per step z = conv(x_t, kernel) + bias + conv(h, recurrent_kernel) ('same', stride
1), gates i, f, c, o; c = RACT(f) c + RACT(i) ACT(c~), h = RACT(o) ACT(c)."""

import numpy as np

ACTIVATIONS = {
    "tanh": np.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0.0),
    "linear": lambda x: x,
    "hard_sigmoid": lambda x: np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    "hard_sigmoid_keras2": lambda x: np.clip(0.2 * x + 0.5, 0.0, 1.0),
}


def _pad_before(size, kernel, stride, dilation, padding):
    span = (kernel - 1) * dilation + 1
    if padding == "same":
        out = -(-size // stride)
        return out, max((out - 1) * stride + span - size, 0) // 2
    return (size - span) // stride + 1, 0


def conv2d(x, kernel, strides=(1, 1), padding="valid", dilation=(1, 1)):
    """TensorFlow's convolution of ``x`` (n, H, W, C) by ``kernel`` (KH, KW, C, M), float64."""
    n, ih, iw, _ = x.shape
    kh, kw, _, m = kernel.shape
    oh, pt = _pad_before(ih, kh, strides[0], dilation[0], padding)
    ow, pl = _pad_before(iw, kw, strides[1], dilation[1], padding)
    out = np.zeros((n, oh, ow, m))
    for ky in range(kh):
        for kx in range(kw):
            for oy in range(oh):
                y = oy * strides[0] - pt + ky * dilation[0]
                if not 0 <= y < ih:
                    continue
                for ox in range(ow):
                    xx = ox * strides[1] - pl + kx * dilation[1]
                    if 0 <= xx < iw:
                        out[:, oy, ox] += x[:, y, xx] @ kernel[ky, kx]
    return out


def conv3d(x, kernel, strides=(1, 1, 1), padding="valid", dilation=(1, 1, 1)):
    """TensorFlow's convolution of ``x`` (n, D, H, W, C) by ``kernel`` (KD, KH, KW, C, M), float64:
    the 2-D convolutions of each depth tap summed."""
    n, idepth = x.shape[:2]
    kd = kernel.shape[0]
    od, pf = _pad_before(idepth, kd, strides[0], dilation[0], padding)
    planes = []
    for oz in range(od):
        acc = None
        for kz in range(kd):
            z = oz * strides[0] - pf + kz * dilation[0]
            if 0 <= z < idepth:
                plane = conv2d(x[:, z], kernel[kz], strides[1:], padding, dilation[1:])
                acc = plane if acc is None else acc + plane
        if acc is None:  # a window entirely in the padding
            acc = conv2d(x[:, 0], kernel[0], strides[1:], padding, dilation[1:]) * 0.0
        planes.append(acc)
    return np.stack(planes, 1)


def conv_lstm(
    x,
    kernel,
    recurrent_kernel,
    bias=None,
    strides=1,
    padding="valid",
    dilation_rate=1,
    activation="tanh",
    recurrent_activation="sigmoid",
    return_sequences=False,
    go_backwards=False,
):
    """ConvLSTM2D (``x`` (batch, steps, H, W, C), kernels (KH, KW, ., 4F)), ConvLSTM1D (``x``
    (batch, steps, L, C), kernels (K, ., 4F)) or ConvLSTM3D (``x`` (batch, steps, D, H, W, C),
    kernels (KD, KH, KW, ., 4F)). Returns ``(output, h, c)``."""
    x = np.asarray(x, np.float64)
    if x.ndim == 6:
        return _conv_lstm3d(
            x,
            kernel,
            recurrent_kernel,
            bias,
            strides,
            padding,
            dilation_rate,
            activation,
            recurrent_activation,
            return_sequences,
            go_backwards,
        )
    one_d = x.ndim == 4
    if one_d:
        x, kernel, recurrent_kernel = x[:, :, None], kernel[None], recurrent_kernel[None]
    pair = (
        (lambda v: (1, v) if isinstance(v, int) else (1,) + tuple(v))
        if one_d
        else (lambda v: (v, v) if isinstance(v, int) else tuple(v))
    )
    act, ract = ACTIVATIONS[activation], ACTIVATIONS[recurrent_activation]
    kernel, recurrent_kernel = np.asarray(kernel, np.float64), np.asarray(recurrent_kernel, np.float64)
    filters = recurrent_kernel.shape[-1] // 4
    batch, steps = x.shape[:2]
    z = conv2d(x.reshape((-1,) + x.shape[2:]), kernel, pair(strides), padding, pair(dilation_rate))
    if bias is not None:
        z = z + np.asarray(bias, np.float64)
    z = z.reshape((batch, steps) + z.shape[1:])
    h = np.zeros(z.shape[:1] + z.shape[2:-1] + (filters,))
    c = np.zeros_like(h)
    outputs = []
    for k in range(steps):
        t = steps - 1 - k if go_backwards else k
        g = z[:, t] + conv2d(h, recurrent_kernel, (1, 1), "same")
        i, f, cc, o = (g[..., j * filters : (j + 1) * filters] for j in range(4))
        c = ract(f) * c + ract(i) * act(cc)
        h = ract(o) * act(c)
        outputs.append(h)
    output = np.stack(outputs, 1) if return_sequences else h
    if one_d:
        squeeze = (lambda a: a[:, :, 0]) if return_sequences else (lambda a: a[:, 0])
        return squeeze(output), h[:, 0], c[:, 0]
    return output, h, c


def _conv_lstm3d(
    x,
    kernel,
    recurrent_kernel,
    bias,
    strides,
    padding,
    dilation_rate,
    activation,
    recurrent_activation,
    return_sequences,
    go_backwards,
):
    triple = lambda v: (v, v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
    act, ract = ACTIVATIONS[activation], ACTIVATIONS[recurrent_activation]
    kernel, recurrent_kernel = np.asarray(kernel, np.float64), np.asarray(recurrent_kernel, np.float64)
    filters = recurrent_kernel.shape[-1] // 4
    batch, steps = x.shape[:2]
    z = conv3d(x.reshape((-1,) + x.shape[2:]), kernel, triple(strides), padding, triple(dilation_rate))
    if bias is not None:
        z = z + np.asarray(bias, np.float64)
    z = z.reshape((batch, steps) + z.shape[1:])
    h = np.zeros(z.shape[:1] + z.shape[2:-1] + (filters,))
    c = np.zeros_like(h)
    outputs = []
    for k in range(steps):
        t = steps - 1 - k if go_backwards else k
        g = z[:, t] + conv3d(h, recurrent_kernel, (1, 1, 1), "same")
        i, f, cc, o = (g[..., j * filters : (j + 1) * filters] for j in range(4))
        c = ract(f) * c + ract(i) * act(cc)
        h = ract(o) * act(c)
        outputs.append(h)
    return (np.stack(outputs, 1) if return_sequences else h), h, c
