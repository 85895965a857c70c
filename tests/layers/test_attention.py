"""MultiHeadAttention, Attention and AdditiveAttention against numpy references on odd shapes (sequence
1, batch 1, one head, key_dim 1, sequence 37, three heads), masks (an all-masked query in every mask
mode), causal masks, on every device; validation and configs."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import built_zoo

import malinn
from malinn.layers import AdditiveAttention, Attention, MultiHeadAttention
from malinn.plan.kinds.attention import _LOWEST

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)


def _softmax(x, keep, mode):
    """Keras's masked softmax over the last axis in each mask mode (float64; x in float32 first,
    as the masked scores are in Keras)."""
    x = x.astype(np.float32)
    if mode == "lowest":
        x = np.where(keep, x, np.float32(_LOWEST))
    elif mode == "zeroed":
        x = np.where(keep, x, np.float32(-1e9))
    else:
        x = x + (1 - keep.astype(np.float32)) * np.float32(-1e9)
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    return p * keep if mode == "zeroed" else p


def mha_reference(layer, query, value, key=None, mask=None):
    """numpy's MultiHeadAttention (float64) with the layer's weights."""
    key = value if key is None else key
    w = {
        name: getattr(layer, name).astype(np.float64) if getattr(layer, name) is not None else 0.0
        for name in layer.weight_names
    }

    def project(x, name):
        y = np.einsum("btd,dhk->bhtk", x, w[f"{name}_kernel"])
        return y + w[f"{name}_bias"][None, :, None] if layer.use_bias else y

    q, k, v = project(query, "query"), project(key, "key"), project(value, "value")
    scores = np.einsum("bhtk,bhsk->bhts", q, k) / np.sqrt(layer.key_dim)
    keep = np.ones(scores.shape, bool)
    if mask is not None:
        keep &= (mask != 0)[:, None]
    if layer.use_causal_mask:
        t, s = scores.shape[-2:]
        keep &= np.tril(np.ones((t, s), bool))
    if mask is not None and layer.mask_mode == "added" and not layer.use_causal_mask:
        x = (scores + (1 - mask[:, None]) * -1e9).astype(np.float32).astype(np.float64)
        e = np.exp(x - x.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
    else:
        p = _softmax(scores, keep, layer.mask_mode)
    out = np.einsum("bhts,bhsk->bthk", p, v)
    y = np.einsum("bthk,hko->bto", out, w["output_kernel"])
    return y + (w["output_bias"] if layer.use_bias else 0)


def _randomize(layer, rng, scale=1.0):
    layer.set_weights([rng.standard_normal(w.shape).astype(np.float32) * scale for w in layer.get_weights()])


def _check(got, want):
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * max(1.0, float(np.abs(want).max())))


MHA_CASES = [  # batch, Tq, Tv, query features, value features, heads, key_dim, value_dim, key given, output
    (2, 5, 7, 8, 6, 2, 3, 4, False, None),
    (1, 1, 1, 3, 3, 1, 1, 1, False, None),
    (3, 37, 13, 5, 4, 3, 2, 5, True, 7),
    (2, 4, 1, 6, 5, 1, 4, 2, True, None),
]


@pytest.mark.parametrize("case", MHA_CASES, ids=lambda c: "x".join(map(str, c[:8])) + ("-key" if c[8] else ""))
@pytest.mark.parametrize("masked", ["none", "mask", "causal", "both"])
def test_multi_head_attention_matches_numpy(device, case, masked):
    batch, tq, tv, dq, dv, heads, kd, vd, with_key, out = case
    rng = np.random.default_rng(sum(case[:8]))
    q_in, v_in = malinn.Input((tq, dq)), malinn.Input((tv, dv))
    k_in = malinn.Input((tv, dv + 1)) if with_key else None
    m_in = malinn.Input((tq, tv)) if masked in ("mask", "both") else None
    layer = MultiHeadAttention(heads, kd, value_dim=vd, output_shape=out)
    y = layer(q_in, v_in, key=k_in, attention_mask=m_in, use_causal_mask=masked in ("causal", "both"))
    inputs = [t for t in (q_in, v_in, k_in, m_in) if t is not None]
    model = malinn.Functional(inputs, y)
    _randomize(layer, rng, 0.7)
    q = rng.standard_normal((batch, tq, dq)).astype(np.float32)
    v = rng.standard_normal((batch, tv, dv)).astype(np.float32)
    k = rng.standard_normal((batch, tv, dv + 1)).astype(np.float32) if with_key else None
    m = (rng.random((batch, tq, tv)) > 0.4).astype(np.float32) if m_in is not None else None
    if m is not None:
        m[0, 0] = 0  # a query that may attend to nothing
    got = model.predict([x for x in (q, v, k, m) if x is not None], verbose=0)
    want = mha_reference(
        layer, q.astype(np.float64), v.astype(np.float64), None if k is None else k.astype(np.float64), m
    )
    assert got.shape == (batch, tq, out or dq)
    _check(got, want)


@pytest.mark.parametrize("mode", ["lowest", "zeroed", "added"])
def test_a_fully_masked_query_computes_as_keras_does(device, mode):
    """Keras 3 averages the values (its lowest score), with dropout zeroes the weights; tf_keras adds -1e9."""
    rng = np.random.default_rng(3)
    q_in, m_in = malinn.Input((3, 4)), malinn.Input((3, 5))
    v_in = malinn.Input((5, 4))
    layer = MultiHeadAttention(2, 3, mask_mode=mode)
    model = malinn.Functional([q_in, v_in, m_in], layer(q_in, v_in, attention_mask=m_in))
    _randomize(layer, rng)
    q, v = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((2, 5, 4)).astype(np.float32)
    m = np.ones((2, 3, 5), np.float32)
    m[1, 2] = 0
    m[0, 1, ::2] = 0
    got = model.predict([q, v, m], verbose=0)
    _check(got, mha_reference(layer, q.astype(np.float64), v.astype(np.float64), mask=m))
    if mode == "zeroed":  # the output projection's bias alone
        _check(got[1, 2], layer.output_bias)


def attention_reference(layer, q, v, k=None, q_mask=None, v_mask=None):
    k = v if k is None else k
    if isinstance(layer, AdditiveAttention):
        scale = layer.scale if layer.scale is not None else 1.0
        scores = (scale * np.tanh(q[:, :, None] + k[:, None])).sum(-1)
    elif layer.score_mode == "concat":
        scale = float(layer.scale) if layer.scale is not None else 1.0
        scores = float(layer.concat_score_weight) * np.tanh(scale * (q[:, :, None] + k[:, None])).sum(-1)
    else:
        scores = q @ k.transpose(0, 2, 1) * (float(layer.scale) if layer.scale is not None else 1.0)
    keep = np.ones(scores.shape, bool)
    if v_mask is not None:
        keep &= (v_mask != 0)[:, None]
    if layer.use_causal_mask:
        keep &= np.tril(np.ones(scores.shape[-2:], bool))
    out = _softmax(scores, keep, "added") @ v
    return out * (q_mask != 0)[..., None] if q_mask is not None else out


@pytest.mark.parametrize("kind", ["dot", "dot_scaled", "concat", "additive", "additive_unscaled"])
@pytest.mark.parametrize("shape", [(2, 5, 7, 4, 3), (1, 1, 1, 1, 1), (3, 37, 6, 3, 2)], ids=str)
@pytest.mark.parametrize("extras", ["plain", "key_masks_causal"])
def test_attention_layers_match_numpy(device, kind, shape, extras):
    batch, tq, tv, d, dv = shape
    rng = np.random.default_rng(tq * 7 + tv)
    layer = (
        AdditiveAttention(use_scale=kind == "additive")
        if kind.startswith("additive")
        else Attention(use_scale=kind != "dot", score_mode="concat" if kind == "concat" else "dot")
    )
    full = extras != "plain"
    q_in, v_in = malinn.Input((tq, d)), malinn.Input((tv, dv))
    k_in = malinn.Input((tv, d)) if full or dv != d else None
    qm_in, vm_in = (malinn.Input((tq,)), malinn.Input((tv,))) if full else (None, None)
    y = layer(
        [q_in, v_in] + ([k_in] if k_in is not None else []), mask=[qm_in, vm_in] if full else None, use_causal_mask=full
    )
    inputs = [t for t in (q_in, v_in, k_in, qm_in, vm_in) if t is not None]
    model = malinn.Functional(inputs, y)
    if layer.get_weights():
        layer.set_weights([(rng.random(w.shape) + 0.5).astype(np.float32) for w in layer.get_weights()])
    q = rng.standard_normal((batch, tq, d)).astype(np.float32)
    v = rng.standard_normal((batch, tv, dv)).astype(np.float32)
    k = rng.standard_normal((batch, tv, d)).astype(np.float32) if k_in is not None else None
    qm = (rng.random((batch, tq)) > 0.3).astype(np.float32) if full else None
    vm = (rng.random((batch, tv)) > 0.3).astype(np.float32) if full else None
    if full:
        vm[0] = 0  # a sample whose every key is masked
    got = model.predict([x for x in (q, v, k, qm, vm) if x is not None], verbose=0)
    want = attention_reference(layer, *(None if x is None else x.astype(np.float64) for x in (q, v, k, qm, vm)))
    _check(got, want)


def test_validation_and_config_round_trip():
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        MultiHeadAttention(0, 4)
    with pytest.raises(ValueError, match="attends over the sequence axis"):
        MultiHeadAttention(2, 4, attention_axes=(2,))
    with pytest.raises(ValueError, match="score_mode must be"):
        Attention(score_mode="general")
    layer = MultiHeadAttention(2, 3, value_dim=5, output_shape=(7,), name="mha")
    q = malinn.Input((4, 6))
    with pytest.raises(ValueError, match="attention_mask .* is not"):
        layer(q, q, attention_mask=malinn.Input((4, 5)))
    layer(q, q, use_causal_mask=True)
    config = layer.get_config()
    assert config["call_inputs"] == ["query", "value"] and config["use_causal_mask"] and config["output_shape"] == 7
    again = MultiHeadAttention.from_config(config)
    assert again.get_config() == config
    assert [w.shape for w in layer.get_weights()] == [
        (6, 2, 3),
        (2, 3),
        (6, 2, 3),
        (2, 3),
        (6, 2, 5),
        (2, 5),
        (2, 5, 7),
        (7,),
    ]
    with pytest.raises(ValueError, match="same inputs"):
        layer(q, q, key=q)


ZOO_SCRIPT = Path(__file__).with_name("attention_zoo.py")


@pytest.fixture(scope="session")
def attention_zoo(tmp_path_factory):
    """tests/layers/attention_zoo.py's files and Keras's outputs, made once per test run in a child
    process (TensorFlow never shares this process)."""
    folder = built_zoo(tmp_path_factory, ZOO_SCRIPT)
    return folder, json.loads((folder / "manifest.json").read_text())


def test_keras_attention_models_match_keras_in_every_file_form(attention_zoo, device):
    """MultiHeadAttention (masks with a query that may attend to nothing, causal, dropout set,
    output_shape, sequence 1 and 37), Attention, AdditiveAttention and Transformer encoder and
    decoder blocks saved by Keras 3 and tf_keras as .keras and .h5: Keras's outputs within
    1e-5 * max(1, |y|) on every device."""
    folder, entries = attention_zoo
    assert len(entries) == 48
    for entry in entries:
        data = np.load(folder / entry["data"])
        xs = [data[f"x{i}"] for i in range(len(data.files) - 1)]
        model = malinn.load_model(str(folder / entry["file"]))
        got = model.predict(xs if len(xs) > 1 else xs[0], verbose=0)
        want = data["y"]
        error = float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max()))
        assert error < 1e-5, f"{entry['file']} on {device.name}: {error:.3g}"
