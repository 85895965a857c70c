"""numpy definitions of the layers that grow or renormalize images (transposed convolution,
tf.image.resize without antialiasing, group normalization), for the tests and the Oclgrind driver."""

import numpy as np

from malinn.layers.convolution_transpose import transposed_length, transposed_padding


def conv_transpose_reference(x, kernel, bias, strides, dilation, padding, output_padding):
    """Keras's transposed convolution in float64, input pixel by input pixel (scatter)."""
    n, ih, iw, _ = x.shape
    kh, kw, filters, _ = kernel.shape
    pads = output_padding or (None, None)
    oh = transposed_length(ih, kh, strides[0], dilation[0], padding, pads[0])
    ow = transposed_length(iw, kw, strides[1], dilation[1], padding, pads[1])
    pt = transposed_padding(ih, oh, kh, strides[0], dilation[0], padding)
    pl = transposed_padding(iw, ow, kw, strides[1], dilation[1], padding)
    out = np.zeros((n, oh, ow, filters))
    x, kernel = x.astype(np.float64), kernel.astype(np.float64)
    for i in range(ih):
        for j in range(iw):
            for a in range(kh):
                for b in range(kw):
                    y, z = i * strides[0] + a * dilation[0] - pt, j * strides[1] + b * dilation[1] - pl
                    if 0 <= y < oh and 0 <= z < ow:
                        out[:, y, z] += x[:, i, j] @ kernel[a, b].T
    return out + (0.0 if bias is None else bias)


def resize_reference(x, height, width, interpolation):
    """tf.image.resize without antialiasing: half-pixel centres, the scale in float32."""
    if interpolation in ("bicubic", "area"):
        from resize_references import area_reference, bicubic_reference

        return (bicubic_reference if interpolation == "bicubic" else area_reference)(x, height, width)
    n, ih, iw, c = x.shape

    def coordinates(out, size):
        scale = np.float32(size) / np.float32(out)
        centre = (np.arange(out, dtype=np.float32) + np.float32(0.5)) * scale
        if interpolation == "nearest":
            index = np.clip(np.floor(centre).astype(int), 0, size - 1)
            return index, index, np.zeros(out, np.float32)
        source = centre - np.float32(0.5)
        low = np.floor(source)
        return (
            np.maximum(low.astype(int), 0),
            np.minimum(np.ceil(source).astype(int), size - 1),
            (source - low).astype(np.float32),
        )

    y0, y1, wy = coordinates(height, ih)
    x0, x1, wx = coordinates(width, iw)
    wx, wy = wx[None, None, :, None], wy[None, :, None, None]
    top = x[:, y0][:, :, x0] + (x[:, y0][:, :, x1] - x[:, y0][:, :, x0]) * wx
    bottom = x[:, y1][:, :, x0] + (x[:, y1][:, :, x1] - x[:, y1][:, :, x0]) * wx
    return top + (bottom - top) * wy


def group_norm_reference(x, groups, epsilon, gamma, beta):
    x64 = x.astype(np.float64)
    grouped = x64.reshape(x.shape[0], -1, groups, x.shape[-1] // groups)
    mean = grouped.mean(axis=(1, 3), keepdims=True)
    var = grouped.var(axis=(1, 3), keepdims=True)
    y = ((grouped - mean) / np.sqrt(var + epsilon)).reshape(x.shape)
    return y * (1.0 if gamma is None else gamma) + (0.0 if beta is None else beta)


def layer_reference(layer, x, weights):
    """The numpy output of a Conv2DTranspose (before its activation), a Resizing or a bilinear
    UpSampling2D on ``x``, with ``weights`` the layer's."""
    name = type(layer).__name__
    if name == "Conv2DTranspose":
        return conv_transpose_reference(
            x,
            weights[0],
            weights[1] if len(weights) > 1 else None,
            layer.strides,
            layer.dilation_rate,
            layer.padding,
            layer.output_padding,
        )
    if name == "Resizing":
        return resize_reference(x, layer.height, layer.width, layer.interpolation)
    return resize_reference(x, x.shape[1] * layer.size[0], x.shape[2] * layer.size[1], layer.interpolation)
