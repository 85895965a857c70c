"""Runs malinn kernels on given cases and checks them against numpy: the program that
tests/test_oclgrind.py starts under Oclgrind (``oclgrind --check-api --data-races python3
tests/oclgrind_driver.py CASES.json``).

Each case is a JSON object:

* ``{"op": "matmul", "codename": C, "shape": [m, k, n], "config": {...} | null, "bias": bool,
  "activation": name | null, "params": {...}, "affine": bool}``: ``R = activation(A x B + bias)``,
  then ``R * scale + shift`` per row, with kernel ``C`` (``config``: the defines of one tuned
  configuration, see ``tuning_configurations`` in tests/test_oclgrind.py; what the kernel's
  epilogue can fuse is fused, the rest runs as its own kernels);
* ``{"op": "bias" | "affine", "layout": L, "shape": [rows, cols]}``;
* ``{"op": "activation", "name": A, "layout": L, "shape": [rows, cols], "params": {...}}``;
* ``{"op": "relayout", "src": L1, "dst": L2, "shape": [rows, cols]}``;
* ``{"op": "reshape", "src": L1, "dst": L2, "shape": [rows, cols], "view": [rows2, cols2]}``;
* ``{"op": "model", "codename": C, "input": d, "units": [...], "activations": [...], "batch": n,
  "batch_size": s | null, "split_samples": k | null}``: a Sequential of Dense layers (with a
  BatchNormalization after the first) predicted with matmul kernel ``C``; ``split_samples``
  lowers the device's largest allocation to what ``k`` samples need, so that the batch is split;
* ``{"op": "graph", "codename": C, "batch": n}``: a Functional graph with every merge kernel
  (tests/test_oclgrind.py's ``graph_cases``), its Dense layers run with matmul kernel ``C``.

For each case the driver writes a line ``@@malinn-case N`` to stderr before running it (and
flushes), so that whatever Oclgrind reports on stderr can be attributed to the case that caused
it, then writes one JSON line to stdout: ``{"case": N, "error": max |got - want| / max(1, |want|),
"nan_mismatch": bool, "seconds": s}`` or ``{"case": N, "exception": "..."}``. It never imports TensorFlow.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from support import activation as ref_activation  # noqa: E402

import malinn  # noqa: E402
from malinn import ops  # noqa: E402
from malinn.choice.matrix import DeviceMatrix  # noqa: E402
from malinn.library.kernel_library import load_library  # noqa: E402
from malinn.library.layout import Layout  # noqa: E402

MARK = "@@malinn-case"

# Oclgrind 21.10's --uninitialized check misreports values in a buffer created after another was
# released (its shadow memory is not reset for the new buffer: a plain pyopencl program that
# uploads, multiplies and adds a bias twice, dropping the first round's buffers, shows it). So the
# driver keeps every buffer malinn allocates alive until it exits: no buffer is ever reused, and the
# check stays meaningful. Only the lifetime changes; the buffers are malinn's own.
_KEPT = []


def _keep_buffers():
    from malinn.backends.opencl import OpenCLDevice

    allocate = OpenCLDevice.alloc

    def allocate_and_keep(self, *args, **kwargs):
        buffer = allocate(self, *args, **kwargs)
        _KEPT.append(buffer)
        return buffer

    OpenCLDevice.alloc = allocate_and_keep


def _spec_with_config(spec, config):
    """``spec`` in one tuned configuration (a dict of defines), restrictions re-evaluated."""
    if not config:
        return spec
    return spec.configure(config)


def _download_padded(matrix):
    import pyopencl as cl

    flat = np.empty(matrix.padded[0] * matrix.padded[1], np.float32)
    cl.enqueue_copy(matrix.device.queue, flat, matrix.buffer, is_blocking=True)
    return matrix.layout.unpack(flat, matrix.padded, matrix.padded)


def _error(got, want):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if got.shape != want.shape:
        return {"exception": f"shape {got.shape} != {want.shape}"}
    nan_mismatch = bool((np.isnan(got) != np.isnan(want)).any())
    finite = ~np.isnan(want)
    err = 0.0
    if finite.any():
        scale = max(1.0, float(np.abs(want[finite]).max()))
        err = float(np.abs(got[finite] - want[finite]).max()) / scale
    return {"error": err, "nan_mismatch": nan_mismatch}


def run_case(case, device, library, rng):
    op = case["op"]
    if op == "matmul":
        m, k, n = case["shape"]
        spec = _spec_with_config(library[case["codename"]], case.get("config"))
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        want = a.astype(np.float64) @ b.astype(np.float64)
        extra = {}
        if case.get("bias"):
            bias = rng.standard_normal(m).astype(np.float32)
            extra["bias"] = ops.upload_vector(device, bias)
            want = want + bias[:, None]
        if case.get("activation"):
            extra["activation"] = case["activation"]
            extra["params"] = case.get("params") or {}
            want = ref_activation(case["activation"], want, axis=0, **extra["params"])
        if case.get("affine"):
            scale, shift = rng.standard_normal((2, m)).astype(np.float32)
            extra["affine"] = (ops.upload_vector(device, scale), ops.upload_vector(device, shift))
            want = want * scale[:, None] + shift[:, None]
        r = ops.matmul(DeviceMatrix.from_host(a), DeviceMatrix.from_host(b), spec, device, **extra)
        result = _error(r.numpy(), want)
        result["kernel"] = spec.codename
        result["defines"] = dict(spec.defines)
        full = _download_padded(r)
        result["padding_nonzero"] = int(np.count_nonzero(full[m:, :]) + np.count_nonzero(full[:, n:]))
        return result
    if op == "model":
        return run_model(case, device, rng)
    if op == "graph":
        return run_graph(case, device, rng)
    if op == "attention":
        return run_attention(case, device, rng)
    if op == "layer":
        return run_layer(case, device, rng)
    if op == "recurrent":
        return run_recurrent(case, device, rng)
    if op == "conv_lstm":
        return run_conv_lstm(case, rng)
    if op == "window":
        return run_window(case, device, rng)
    layout = case.get("layout") or case.get("src")
    rows, cols = case["shape"]
    x = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    padded = Layout.parse(layout).padded_shape(rows, cols, 4, 4)
    mat = DeviceMatrix.upload(device, x, layout, padded)
    if op == "bias":
        bias = rng.standard_normal(rows).astype(np.float32)
        ops.bias_add(mat, ops.upload_vector(device, bias))
        want = x.astype(np.float64) + bias[:, None]
    elif op == "affine":
        scale, shift = rng.standard_normal((2, rows)).astype(np.float32)
        ops.affine(mat, ops.upload_vector(device, scale), ops.upload_vector(device, shift))
        want = x.astype(np.float64) * scale[:, None] + shift[:, None]
    elif op == "activation":
        params = case.get("params") or {}
        ops.activation(mat, case["name"], **params)
        want = ref_activation(case["name"], x.astype(np.float64), axis=0, **params)
    elif op == "relayout":
        dst = Layout.parse(case["dst"])
        mat = ops.to_layout(mat, device, dst, dst.padded_shape(rows, cols, 8, 4))
        want = x
    elif op == "reshape":  # the same tensor as another matrix view: flat index col * rows + row kept
        dst, (rows, cols) = Layout.parse(case["dst"]), case["view"]
        mat = ops.reshape(mat, (rows, cols), dst, dst.padded_shape(rows, cols, 8, 4))
        want = x.T.reshape(-1).reshape(cols, rows).T
    else:
        raise ValueError(f"unknown op {op!r}")
    mat.host = None
    result = _error(mat.numpy(), want)
    full = _download_padded(mat)
    result["padding_nonzero"] = int(np.count_nonzero(full[rows:, :]) + np.count_nonzero(full[:, cols:]))
    return result


def _layer_reference(layer, x):
    """numpy's answer for the single-input layers the Oclgrind cases run (float64)."""
    kind, rank = type(layer).__name__, x.ndim
    w = [v.astype(np.float64) for v in layer.get_weights()]

    def axes(axis):
        return tuple(sorted(a % rank for a in (axis if isinstance(axis, (list, tuple)) else [axis])))

    def along(v, keep):
        return v.reshape([x.shape[i] if i in keep else 1 for i in range(rank)])

    if kind == "BatchNormalization":
        keep = axes(layer.axis)
        return (x - along(w[2], keep)) / np.sqrt(along(w[3], keep) + layer.epsilon) * along(w[0], keep) + along(
            w[1], keep
        )
    if kind == "Normalization":
        keep = axes(layer.axis)
        return (x - along(w[0], keep)) / np.maximum(np.sqrt(along(w[1], keep)), 1e-7)
    if kind == "PReLU":
        return np.where(x < 0, w[0] * x, x)
    if kind == "Masking":
        return x * (x != layer.mask_value).any(-1, keepdims=True)
    if kind == "Softmax":
        a = axes(layer.axis)
        z = np.exp(x - x.max(axis=a, keepdims=True))
        return z / z.sum(axis=a, keepdims=True)
    if kind == "LayerNormalization":
        a = axes(layer.axis)
        var = x.var(axis=a, keepdims=True)
        if layer.rms_scaling:
            return x / np.sqrt(var + layer.epsilon) * along(w[0], a)
        return (x - x.mean(axis=a, keepdims=True)) / np.sqrt(var + layer.epsilon) * along(w[0], a) + along(w[1], a)
    if kind == "UnitNormalization":
        return x / np.maximum(np.sqrt((x * x).sum(axis=axes(layer.axis), keepdims=True)), layer.epsilon)
    if kind == "Permute":
        return x.transpose((0,) + tuple(layer.dims))
    if kind == "RepeatVector":
        return np.repeat(x[:, None, :], layer.n, axis=1)
    if kind in ("CategoryEncoding", "IntegerLookup"):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "layers"))
        from encoding_references import layer_reference

        return layer_reference(layer, x)
    raise ValueError(f"no reference for {kind}")


def run_attention(case, device, rng):
    """MultiHeadAttention (a separate key, an attention mask with a query that may attend to nothing,
    causal) and AdditiveAttention (query and value masks) on odd shapes, against numpy."""
    from layers.test_attention import attention_reference, mha_reference

    import malinn

    batch, tq, tv = case["batch"], case["tq"], case["tv"]
    if case.get("codename"):  # a kernel chosen for both layers (the tiled one), forgotten after
        from malinn.choice import kernel_choice

        kernel_choice.use("attention", case["codename"], device, case.get("config"))
        try:
            result = run_attention({**case, "codename": None}, device, rng)
        finally:
            kernel_choice.forget(device)
        ran = set(result.pop("attention_kernels", ()))
        return result if ran == {case["codename"]} else {"exception": f"the plans ran {sorted(ran)}", **result}
    q_in, v_in, k_in, m_in = malinn.Input((tq, 5)), malinn.Input((tv, 3)), malinn.Input((tv, 4)), malinn.Input((tq, tv))
    mha = malinn.layers.MultiHeadAttention(3, 2, value_dim=3, mask_mode=case["mode"])
    additive = malinn.layers.AdditiveAttention()
    qm_in, vm_in = malinn.Input((tq,)), malinn.Input((tv,))
    y = mha(q_in, v_in, key=k_in, attention_mask=m_in, use_causal_mask=True)
    model = malinn.Functional([q_in, v_in, k_in, m_in], y)
    mha.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in mha.get_weights()])
    xs = [
        rng.standard_normal((batch, tq, 5)),
        rng.standard_normal((batch, tv, 3)),
        rng.standard_normal((batch, tv, 4)),
        (rng.random((batch, tq, tv)) > 0.4),
    ]
    xs = [x.astype(np.float32) for x in xs]
    xs[3][0, 0] = 0
    got = model.predict(xs, verbose=0)
    result = _error(got, mha_reference(mha, *(x.astype(np.float64) for x in xs[:3]), mask=xs[3]))
    a_in, b_in = malinn.Input((tq, 3)), malinn.Input((tv, 3))
    z = additive([a_in, b_in], mask=[qm_in, vm_in], use_causal_mask=True)
    second = malinn.Functional([a_in, b_in, qm_in, vm_in], z)
    additive.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in additive.get_weights()])
    ys = [
        rng.standard_normal((batch, tq, 3)),
        rng.standard_normal((batch, tv, 3)),
        rng.random((batch, tq)) > 0.3,
        rng.random((batch, tv)) > 0.3,
    ]
    ys = [y.astype(np.float32) for y in ys]
    other = _error(
        second.predict(ys, verbose=0),
        attention_reference(additive, ys[0].astype(np.float64), ys[1].astype(np.float64), q_mask=ys[2], v_mask=ys[3]),
    )
    if "exception" in other or other["error"] > result.get("error", 0):
        result = other if "exception" in other else {**result, "error": other["error"]}
    launches = model.plan(batch).launches + second.plan(batch).launches
    result["attention_kernels"] = sorted({lh.function for lh in launches if lh.function.startswith("attention")})
    return result


def run_layer(case, device, rng):
    """One single-input layer on odd samples, first or after a Dense run by morton_4_2 (blocked layout)."""
    from malinn import Sequential, layers
    from malinn.choice import kernel_choice

    layer = getattr(layers, case["layer"])(**case["config"])
    shape = tuple(case["shape"])
    model = Sequential(([layers.Dense(shape[-1])] if case["after_dense"] else []) + [layer])
    if case["after_dense"]:
        ops.use("matmul", "morton_4_2", device)
    model.build((None,) + shape)
    for each in model.layers:
        weights = each.get_weights()
        if weights:
            each.set_weights(
                [
                    np.abs(rng.standard_normal(v.shape)).astype(np.float32) + 0.5
                    if i == len(weights) - 1
                    else rng.standard_normal(v.shape).astype(np.float32)
                    for i, v in enumerate(weights)
                ]
                if type(each).__name__ != "Normalization"
                else [rng.standard_normal(weights[0].shape), rng.random(weights[0].shape) + 0.5]
            )
    x = (rng.standard_normal((case["batch"],) + shape) * 3).astype(np.float32)
    h = x.astype(np.float64)
    if case["after_dense"]:
        kernel, bias = model.layers[0].get_weights()
        h = h @ kernel + bias
    try:
        got = model.predict(x)
    finally:
        kernel_choice.forget(device)
    return _error(got, _layer_reference(layer, h))


def run_recurrent(case, device, rng):
    """Embedding (7 indices, 3 features) then one recurrent layer of 3 units over 4 steps, batch 2,
    against tests/layers/recurrent_reference.py; ``masked``: mask_zero, the second sample all 0."""
    from malinn import layers

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "layers"))
    import recurrent_reference as ref

    cell, options = case["cell"], dict(case["options"])
    cls = {"simple_rnn": layers.SimpleRNN, "lstm": layers.LSTM, "gru": layers.GRU}[cell]
    real_kind = type(device).__dict__.get("kind")  # a later case runs as the device is again
    if case.get("as_gpu"):  # the plan's choices for a GPU (kernels/recurrent.cl KS > 1) on this device
        type(device).kind = property(lambda self: "gpu")
    try:
        return _run_recurrent(case, device, rng, ref, cell, options, cls)
    finally:
        if real_kind is not None:
            type(device).kind = real_kind
        elif "kind" in type(device).__dict__:  # the class inherited it: drop the override
            del type(device).kind


def _run_recurrent(case, device, rng, ref, cell, options, cls):
    import malinn
    from malinn import layers

    emb, rnn = layers.Embedding(7, 3, mask_zero=case["masked"]), cls(3, **options)
    x = malinn.Input((4,))
    model = malinn.Functional(x, rnn(emb(x)))
    table = rng.standard_normal((7, 3)).astype(np.float32)
    emb.set_weights([table])
    weights = [rng.uniform(-0.6, 0.6, w.shape).astype(np.float32) for w in rnn.get_weights()]
    rnn.set_weights(weights)
    xs = rng.integers(1, 7, (2, 4)).astype(np.float32)
    if case["masked"]:
        xs[0, 1], xs[1] = 0, 0
    if case.get("bidirectional"):  # Bidirectional(merge_mode="sum"): the backward sequence flipped by the kernel
        bi = layers.Bidirectional(cls(3, **options), merge_mode="sum")
        model = malinn.Functional(x, bi(emb(x)))
        weights = [rng.uniform(-0.6, 0.6, w.shape).astype(np.float32) for w in bi.get_weights()]
        bi.set_weights(weights)
        half, zero = len(weights) // 2, bool(options.get("return_sequences"))
        e, mask = ref.embedding(xs, table), xs if case["masked"] else None
        forward = ref.recurrent(cell, e, *weights[:half], mask=mask, zero_output_for_mask=zero, **options)[0]
        backward = ref.recurrent(
            cell, e, *weights[half:], mask=mask, zero_output_for_mask=zero, go_backwards=True, **options
        )[0]
        return _error(model.predict(xs, verbose=0), forward + (backward[:, ::-1] if zero else backward))
    want = ref.recurrent(cell, ref.embedding(xs, table), *weights, mask=xs if case["masked"] else None, **options)[0]
    return _error(model.predict(xs, verbose=0), want)


def run_conv_lstm(case, rng):
    """ConvLSTM2D (2 filters, 3x3 'same', 2 steps of 3x4 images of 2 channels, backwards, the
    sequence out) or ConvLSTM1D (its last output and states, length 5, 'valid', stride 2), batch 2,
    against tests/layers/conv_lstm_reference.py."""
    import malinn
    from malinn import layers

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "layers"))
    import conv_lstm_reference as ref

    if case["rank"] == 2:
        layer = layers.ConvLSTM2D(2, 3, padding="same", return_sequences=True, go_backwards=True)
        options, sample = {"padding": "same", "return_sequences": True, "go_backwards": True}, (2, 3, 4, 2)
    else:
        layer = layers.ConvLSTM1D(2, 3, strides=2, return_state=True)
        options, sample = {"strides": 2}, (2, 5, 1)
    x = malinn.Input(sample)
    model = malinn.Functional(x, layer(x))
    weights = [rng.uniform(-0.6, 0.6, w.shape).astype(np.float32) for w in layer.get_weights()]
    layer.set_weights(weights)
    xs = rng.standard_normal((2,) + sample).astype(np.float32)
    got, want = model.predict(xs, verbose=0), ref.conv_lstm(xs, *weights, **options)
    if case["rank"] == 2:
        return _error(got, want[0])
    errors = [_error(g, w) for g, w in zip(got, want)]
    return {"error": max(e["error"] for e in errors), "nan_mismatch": any(e["nan_mismatch"] for e in errors)}


def run_model(case, device, rng):
    from malinn import Sequential
    from malinn.choice import kernel_choice
    from malinn.layers import BatchNormalization, Dense

    kind = type(device).kind
    if case.get("gpu_defaults"):  # the plan's own choices on a GPU (a fused head, say): nothing chosen
        kernel_choice.forget(device)
        type(device).kind = property(lambda self: "gpu")
    else:
        ops.use("matmul", case["codename"], device)
    layers = [Dense(u, activation=a) for u, a in zip(case["units"], case["activations"])]
    layers.insert(1, BatchNormalization())
    model = Sequential(layers)
    model.build((None, case["input"]))
    if case.get("gpu_defaults"):
        kernels = [row["kernel"] for row in model.plan(case["batch"], device).describe()]
        if not any(k.split(" ")[0] == case["codename"] for k in kernels):
            type(device).kind = kind
            raise AssertionError(f"the plan runs {kernels}, not {case['codename']}")
    weights = [w + rng.standard_normal(w.shape).astype(np.float32) * 0.5 for w in model.get_weights()]
    weights[5] = np.abs(weights[5]) + 0.5  # moving variance > 0
    model.set_weights(weights)
    x = rng.standard_normal((case["batch"], case["input"])).astype(np.float32)
    saved = device.max_allocation
    downloads = device.counters["downloads"]
    if case.get("split_samples"):  # lower the largest allocation to what a few samples need
        weights_size = 0
        for layer in model.layers:
            if isinstance(layer, Dense):
                spec = ops.kernel_for("matmul", device, (layer.units, layer.input_dim, case["batch"]))
                rows, cols = ops.matmul_plan(spec, layer.units, layer.input_dim, case["batch"])["a"]
                weights_size = max(weights_size, 4 * rows * cols)
        device.max_allocation = max(model.activation_bytes(case["split_samples"], device)[0], weights_size)
    try:
        max_batch = model.max_batch(device)
        got = model.predict(x, batch_size=case.get("batch_size"))
    finally:
        device.max_allocation = saved
        type(device).kind = kind
    h = x.astype(np.float64)
    for layer in model.layers:
        w = [v.astype(np.float64) for v in layer.get_weights()]
        if isinstance(layer, Dense):
            h = ref_activation(layer.activation, h @ w[0] + w[1], axis=-1)
        else:
            gamma, beta, mean, var = w
            h = (h - mean) / np.sqrt(var + layer.epsilon) * gamma + beta
    result = _error(got, h)
    result["passes"] = device.counters["downloads"] - downloads
    result["max_batch"] = max_batch
    return result


def run_window(case, device, rng):
    """A Sequential of convolution / pooling / pixel-moving layers (``case["layers"]``: [class name,
    kwargs]) with the kernels ``case["use"]`` chooses, against the numpy definitions in support.py."""
    from support import conv2d_reference, depthwise_reference, pool2d_reference, rounded_kernel

    from malinn import Sequential
    from malinn.choice import kernel_choice
    from malinn.registry import lookup

    kernel_choice.forget(device)  # a choice an earlier case made must not route this one
    for op, codename, *config in case.get("use", []):
        ops.use(op, codename, device, config[0] if config else None)
    model = Sequential(
        [lookup("layer", name)(**kwargs) for name, kwargs in case["layers"]], precision=case.get("precision", "fp32")
    )
    model.build((None,) + tuple(case["input"]))
    model.set_weights([rng.standard_normal(w.shape).astype(np.float32) * 0.5 for w in model.get_weights()])
    x = rng.standard_normal((case["batch"],) + tuple(case["input"])).astype(np.float32)
    got = model.predict(x)
    h = x.astype(np.float64)
    for layer in model.layers:
        name, w = type(layer).__name__, layer.get_weights()
        if model.precision != "fp32":  # the kernels' weights as the precision keeps them
            w = [
                rounded_kernel(v, model.precision, name == "DepthwiseConv2D" or (name == "SeparableConv2D" and i == 0))
                if i in layer.kernel_matrices()
                else v
                for i, v in enumerate(w)
            ]
        if name == "Conv2D":
            h = conv2d_reference(h, w[0], w[1], layer.strides, layer.dilation_rate, layer.padding, layer.groups)
        elif name == "DepthwiseConv2D":
            h = depthwise_reference(h, w[0], w[1], layer.strides, layer.dilation_rate, layer.padding)
        elif name == "SeparableConv2D":
            h = (
                depthwise_reference(h, w[0], None, layer.strides, layer.dilation_rate, layer.padding) @ w[1][0, 0]
                + w[2]
            )
        elif name in ("MaxPooling2D", "AveragePooling2D"):
            h = pool2d_reference(h, layer.pool_size, layer.strides, layer.padding, "max" if "Max" in name else "avg")
        elif name == "GlobalAveragePooling2D":
            h = h.mean(axis=(1, 2))
        elif name == "GlobalMaxPooling2D":
            h = h.max(axis=(1, 2))
        elif name == "ZeroPadding2D":
            h = np.pad(h, ((0, 0),) + layer.padding + ((0, 0),))
        elif name == "Cropping2D":
            (t, b), (l, r) = layer.cropping
            h = h[:, t : h.shape[1] - b, l : h.shape[2] - r]
        elif name in ("Conv2DTranspose", "Resizing") or getattr(layer, "interpolation", "nearest") != "nearest":
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "layers"))
            from layers.upsampling_references import layer_reference

            h = layer_reference(layer, h, w)
        elif name == "UpSampling2D":
            h = h.repeat(layer.size[0], axis=1).repeat(layer.size[1], axis=2)
        elif "3D" in name:  # the volumes' layers (the activation follows below)
            from layers.volumetric_reference import layer_reference as volume_reference

            h = volume_reference(layer, h, activated=False)
        else:
            raise ValueError(f"no reference for {name}")
        if getattr(layer, "activation", "linear") != "linear":
            h = ref_activation(layer.activation, h)
    return _error(got, h)


def run_graph(case, device, rng):
    from malinn import Functional, Input
    from malinn.layers import Activation, Add, Average, Concatenate, Dense, Dot

    ops.use("matmul", case["codename"], device)
    x, y = Input((3, 5), name="x"), Input((1, 5), name="y")
    dense, proj = Dense(5, name="d"), Dense(4, name="proj")
    d = dense(x)
    s = Activation("relu")(Add()([d, y]))  # broadcast, relu fused into the merge
    c = Concatenate(axis=1)([s, x])  # (6, 5)
    c2 = Concatenate()([proj(c), c])  # (6, 9)
    model = Functional(
        [x, y], [c2, Dot(axes=(2, 2), normalize=True)([c2, c2]), Activation("tanh")(Average()([x, s, d]))]
    )
    model.set_weights([w + rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
    xs = [rng.standard_normal((case["batch"],) + shape).astype(np.float32) for shape in ((3, 5), (1, 5))]
    got = model.predict(xs)
    (k1, b1), (k2, b2) = ([v.astype(np.float64) for v in layer.get_weights()] for layer in (dense, proj))
    xv, yv = (v.astype(np.float64) for v in xs)
    dv = xv @ k1 + b1
    sv = np.maximum(dv + yv, 0)
    cv = np.concatenate([sv, xv], axis=1)
    c2v = np.concatenate([cv @ k2 + b2, cv], axis=-1)
    unit = c2v / np.linalg.norm(c2v, axis=2, keepdims=True)
    want = [c2v, np.einsum("bpk,bqk->bpq", unit, unit), np.tanh((xv + sv + dv) / 3)]
    errors = [_error(g, w) for g, w in zip(got, want)]
    failed = next((e for e in errors if "exception" in e), None)
    if failed is not None:
        return failed
    return {"error": max(e["error"] for e in errors), "nan_mismatch": any(e["nan_mismatch"] for e in errors)}


def main(argv):
    with open(argv[1]) as fh:
        cases = json.load(fh)
    _keep_buffers()
    device = malinn.get_device()
    print(json.dumps({"device": device.name, "platform": device.platform}), flush=True)
    library = load_library()
    rng = np.random.default_rng(20240605)
    for i, case in enumerate(cases):
        print(f"{MARK} {i}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            result = run_case(case, device, library, rng)
        except Exception as exc:  # reported, not raised: the other cases still run
            result = {"exception": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"}
        device.queue.finish()
        result["case"] = i
        result["seconds"] = round(time.perf_counter() - start, 3)  # what the case costs under Oclgrind
        print(json.dumps(result), flush=True)
    print(f"{MARK} end", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
