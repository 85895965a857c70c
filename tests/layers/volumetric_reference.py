"""numpy definitions (float64) of Keras's 3-D layers on ``(batch, depth, height, width, channels)``:
the convolution, the transposed convolution (each input voxel scattered through each kernel tap to
``i*S + k*D - P``), the window poolings, padding, cropping and nearest upsampling. Padding follows
TensorFlow: ``same`` puts half the total padding before the first voxel, rounded down."""

from __future__ import annotations

import numpy as np


def _same_before(n: int, out: int, span: int, stride: int) -> int:
    return max((out - 1) * stride + span - n, 0) // 2


def conv3d_reference(x, kernel, bias, strides, dilation, padding, groups=1):
    """Keras's Conv3D: ``kernel`` (kd, kh, kw, channels / groups, filters)."""
    x, kernel = np.asarray(x, np.float64), np.asarray(kernel, np.float64)
    spans = [(k - 1) * d + 1 for k, d in zip(kernel.shape[:3], dilation)]
    if padding == "same":
        outs = [-(-n // s) for n, s in zip(x.shape[1:4], strides)]
        before = [_same_before(n, o, p, s) for n, o, p, s in zip(x.shape[1:4], outs, spans, strides)]
    else:
        outs = [(n - p) // s + 1 for n, p, s in zip(x.shape[1:4], spans, strides)]
        before = [0, 0, 0]
    after = [max((o - 1) * s + p - n - b, 0) for n, o, p, s, b in zip(x.shape[1:4], outs, spans, strides, before)]
    xp = np.pad(x, [(0, 0)] + list(zip(before, after)) + [(0, 0)])
    cg, filters = kernel.shape[3], kernel.shape[4]
    mg = filters // groups
    y = np.zeros((x.shape[0], *outs, filters))
    for kz in range(kernel.shape[0]):
        for ky in range(kernel.shape[1]):
            for kx in range(kernel.shape[2]):
                z0, y0, x0 = kz * dilation[0], ky * dilation[1], kx * dilation[2]
                patch = xp[
                    :,
                    z0 : z0 + (outs[0] - 1) * strides[0] + 1 : strides[0],
                    y0 : y0 + (outs[1] - 1) * strides[1] + 1 : strides[1],
                    x0 : x0 + (outs[2] - 1) * strides[2] + 1 : strides[2],
                ]
                for g in range(groups):
                    y[..., g * mg : (g + 1) * mg] += (
                        patch[..., g * cg : (g + 1) * cg] @ kernel[kz, ky, kx, :, g * mg : (g + 1) * mg]
                    )
    return y + (0.0 if bias is None else np.asarray(bias, np.float64))


def transposed_size(n: int, k: int, s: int, d: int, padding: str, output_padding) -> int:
    """Keras's output length of a transposed convolution along one axis (deconv_output_length)."""
    span = (k - 1) * d + 1
    if output_padding is None:
        return n * s + max(span - s, 0) if padding == "valid" else n * s
    pad = span // 2 if padding == "same" else 0
    return (n - 1) * s + span - 2 * pad + output_padding


def conv3d_transpose_reference(x, kernel, bias, strides, dilation, padding, output_padding):
    """Keras's Conv3DTranspose: ``kernel`` (kd, kh, kw, filters, channels); every input voxel
    scattered through every tap, the full result then cut to Keras's output shape where TensorFlow
    cuts it (``same``: half the excess before, rounded down)."""
    x, kernel = np.asarray(x, np.float64), np.asarray(kernel, np.float64)
    pads = output_padding if output_padding is not None else (None,) * 3
    sizes = x.shape[1:4]
    outs = [
        transposed_size(n, k, s, d, padding, p) for n, k, s, d, p in zip(sizes, kernel.shape, strides, dilation, pads)
    ]
    spans = [(k - 1) * d + 1 for k, d in zip(kernel.shape[:3], dilation)]
    before = [_same_before(o, n, p, s) if padding == "same" else 0 for n, o, p, s in zip(sizes, outs, spans, strides)]
    full = [max((n - 1) * s + p, b + o) for n, s, p, b, o in zip(sizes, strides, spans, before, outs)]
    y = np.zeros((x.shape[0], *full, kernel.shape[3]))
    for kz in range(kernel.shape[0]):
        for ky in range(kernel.shape[1]):
            for kx in range(kernel.shape[2]):
                z0, y0, x0 = kz * dilation[0], ky * dilation[1], kx * dilation[2]
                y[
                    :,
                    z0 : z0 + (sizes[0] - 1) * strides[0] + 1 : strides[0],
                    y0 : y0 + (sizes[1] - 1) * strides[1] + 1 : strides[1],
                    x0 : x0 + (sizes[2] - 1) * strides[2] + 1 : strides[2],
                ] += x @ kernel[kz, ky, kx].T
    y = y[:, before[0] : before[0] + outs[0], before[1] : before[1] + outs[1], before[2] : before[2] + outs[2]]
    return y + (0.0 if bias is None else np.asarray(bias, np.float64))


def pool3d_reference(x, pool, strides, padding, mode):
    """Keras's MaxPooling3D (``mode`` "max") or AveragePooling3D ("avg"): taps outside the volume
    left out (the mean over the taps inside)."""
    x = np.asarray(x, np.float64)
    sizes = x.shape[1:4]
    if padding == "same":
        outs = [-(-n // s) for n, s in zip(sizes, strides)]
        before = [_same_before(n, o, k, s) for n, o, k, s in zip(sizes, outs, pool, strides)]
    else:
        outs = [(n - k) // s + 1 for n, k, s in zip(sizes, pool, strides)]
        before = [0, 0, 0]
    y = np.zeros((x.shape[0], *outs, x.shape[4]))
    for index in np.ndindex(*outs):
        lo = [max(i * s - b, 0) for i, s, b in zip(index, strides, before)]
        hi = [min(i * s - b + k, n) for i, s, b, k, n in zip(index, strides, before, pool, sizes)]
        window = x[:, lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]
        y[(slice(None), *index)] = window.max(axis=(1, 2, 3)) if mode == "max" else window.mean(axis=(1, 2, 3))
    return y


def layer_reference(layer, x, activated: bool = True):
    """numpy's answer for one malinn 3-D layer (its weights and options) on ``x``, float64; a
    convolution's activation left out unless ``activated``."""
    from support import activation

    name, w = type(layer).__name__, [np.asarray(v, np.float64) for v in layer.get_weights()]
    bias = w[1] if getattr(layer, "use_bias", False) else None
    if name == "Conv3D":
        y = conv3d_reference(x, w[0], bias, layer.strides, layer.dilation_rate, layer.padding, layer.groups)
        return activation(layer.activation, y) if activated else y
    if name == "Conv3DTranspose":
        y = conv3d_transpose_reference(
            x, w[0], bias, layer.strides, layer.dilation_rate, layer.padding, layer.output_padding
        )
        return activation(layer.activation, y) if activated else y
    if name in ("MaxPooling3D", "AveragePooling3D"):
        return pool3d_reference(x, layer.pool_size, layer.strides, layer.padding, "max" if "Max" in name else "avg")
    if name in ("GlobalMaxPooling3D", "GlobalAveragePooling3D"):
        reduce = np.max if "Max" in name else np.mean
        return reduce(np.asarray(x, np.float64), axis=(1, 2, 3), keepdims=layer.keepdims).reshape(
            layer.compute_output_shape(x.shape)
        )
    if name == "ZeroPadding3D":
        return np.pad(x, ((0, 0),) + tuple(layer.padding) + ((0, 0),))
    if name == "Cropping3D":
        (f, b), (t, d), (left, r) = layer.cropping
        return x[:, f : x.shape[1] - b, t : x.shape[2] - d, left : x.shape[3] - r]
    if name == "UpSampling3D":
        return x.repeat(layer.size[0], axis=1).repeat(layer.size[1], axis=2).repeat(layer.size[2], axis=3)
    raise ValueError(f"no reference for {name}")
