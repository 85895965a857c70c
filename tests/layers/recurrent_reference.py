"""numpy references of Keras's Embedding, SimpleRNN, LSTM and GRU (float64), for the tests."""

import numpy as np

ACTIVATIONS = {
    "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0),
    "linear": lambda x: x,
    "hard_sigmoid": lambda x: np.clip(x + 3, 0, 6) / 6,
    "hard_sigmoid_keras2": lambda x: np.clip(0.2 * x + 0.5, 0, 1),
}


def embedding(x, table):
    """Keras 3's Embedding of float indices (truncated; negative from the end; else NaN)."""
    t = np.trunc(np.asarray(x, np.float64)).astype(np.int64)
    n = table.shape[0]
    inside = (t >= -n) & (t < n)
    out = table.astype(np.float64)[np.where(inside, t % n, 0)]
    out[~inside] = np.nan
    return out


def recurrent(
    cell,
    x,
    kernel,
    recurrent_kernel,
    bias=None,
    units=None,
    activation="tanh",
    recurrent_activation="sigmoid",
    go_backwards=False,
    return_sequences=False,
    mask=None,
    zero_output_for_mask=False,
    reset_after=True,
):
    """``(output, h, c)`` of Keras's ``cell`` ("simple_rnn", "lstm", "gru") over ``x`` (batch,
    steps, features), in float64: the output as Keras returns it."""
    act, ract = ACTIVATIONS[activation], ACTIVATIONS[recurrent_activation]
    x, k, u = (np.asarray(a, np.float64) for a in (x, kernel, recurrent_kernel))
    batch, steps, _ = x.shape
    units = u.shape[0]
    b_in = b_rec = 0.0
    if bias is not None:
        bias = np.asarray(bias, np.float64)
        if cell == "gru" and reset_after:
            b_in, b_rec = bias[0], bias[1]
        else:
            b_in = bias
    h = np.zeros((batch, units))
    c = np.zeros((batch, units))
    out = np.zeros((batch, units))
    outputs = []
    order = range(steps - 1, -1, -1) if go_backwards else range(steps)
    for t in order:
        z = x[:, t] @ k + b_in
        if cell == "simple_rnn":
            nh, nc = act(z + h @ u), c
        elif cell == "lstm":
            g = z + h @ u
            i, f, cc, o = (g[:, j * units : (j + 1) * units] for j in range(4))
            nc = ract(f) * c + ract(i) * act(cc)
            nh = ract(o) * act(nc)
        else:
            xz, xr, xh = (z[:, j * units : (j + 1) * units] for j in range(3))
            uz, ur, uh = (u[:, j * units : (j + 1) * units] for j in range(3))
            if reset_after:
                rec = h @ u + b_rec
                zg, rg = ract(xz + rec[:, :units]), ract(xr + rec[:, units : 2 * units])
                hh = act(xh + rg * rec[:, 2 * units :])
            else:
                zg, rg = ract(xz + h @ uz), ract(xr + h @ ur)
                hh = act(xh + (rg * h) @ uh)
            nh, nc = zg * h + (1 - zg) * hh, c
        if mask is not None:
            keep = (np.asarray(mask)[:, t] != 0)[:, None]
            nh, nc = np.where(keep, nh, h), np.where(keep, nc, c)
            out = np.where(keep, nh, 0.0 if zero_output_for_mask else out)
        else:
            out = nh
        h, c = nh, nc
        outputs.append(out)
    y = np.stack(outputs, 1) if return_sequences else h
    return y, h, c
