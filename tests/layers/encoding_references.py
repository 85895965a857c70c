"""numpy definitions of Keras's CategoryEncoding and IntegerLookup (``invert=False``) as malinn
computes them (docs/CONVERTING.md): Keras's values, and NaN where Keras raises. For the tests and
the Oclgrind driver."""

import numpy as np


def category_encoding_reference(x, num_tokens: int, mode: str) -> np.ndarray:
    """The encoding of indices ``x`` (float, truncated toward zero) over ``num_tokens`` in float64:
    a one-hot of an index outside [0, num_tokens) is zeros; multi-hot and count leave out an index
    >= num_tokens, and a negative or NaN index makes its sample NaN (a NaN one-hot element too)."""
    x = np.asarray(x, np.float64)
    t = np.trunc(x)
    hot = (t[..., None] == np.arange(num_tokens)).astype(np.float64)  # (..., k, num_tokens)
    if mode == "one_hot":
        hot[np.isnan(x)] = np.nan
        return hot[..., 0, :] if x.shape[-1] == 1 else hot
    out = hot.sum(axis=-2) if mode == "count" else hot.max(axis=-2)
    out[(np.isnan(x) | (t < 0)).any(axis=-1)] = np.nan
    return out


def lookup_indices(layer, x) -> np.ndarray:
    """IntegerLookup ``layer``'s indices of tokens ``x`` (float64): the mask token's (0, or past the
    last index where encoded), the token's, or the OOV index (floormod), NaN without OOV indices."""
    x = np.asarray(x, np.float64)
    t = np.trunc(x)
    where = {float(token): layer.token_start + i for i, token in enumerate(layer.tokens)}
    out = np.empty(x.shape)
    for i, value in np.ndenumerate(t):
        if np.isnan(value):
            out[i] = np.nan
        elif layer.mask_token is not None and value == layer.mask_token:
            out[i] = 0 if layer.output_mode == "int" else layer.depth
        elif value in where:
            out[i] = where[value]
        elif layer.num_oov_indices == 0:
            out[i] = np.nan
        else:
            out[i] = layer.oov_start + int(value) % layer.num_oov_indices  # Python's % is floormod
    return out


def integer_lookup_reference(layer, x) -> np.ndarray:
    """IntegerLookup ``layer``'s output on ``x`` in float64."""
    indices = lookup_indices(layer, x)
    if layer.output_mode == "int":
        return indices
    if layer.output_mode == "tf_idf":  # the count times each index's weight
        return category_encoding_reference(indices, layer.depth, "count") * np.asarray(layer.idf_weights, np.float64)
    return category_encoding_reference(indices, layer.depth, layer.output_mode)


def layer_reference(layer, x) -> np.ndarray:
    """The output of a CategoryEncoding or IntegerLookup layer on ``x``."""
    if type(layer).__name__ == "CategoryEncoding":
        return category_encoding_reference(x, layer.num_tokens, layer.output_mode)
    return integer_lookup_reference(layer, x)
