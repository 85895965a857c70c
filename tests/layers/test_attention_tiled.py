"""The tiled attention kernel (kernels/attention_tiled.cl) against the one-item-per-query kernel
(kernels/attention.cl) and numpy on odd shapes (keys 1, 3, 13, 129; head sizes 1, 3, 64; queries
fewer and more than keys, in blocks that end inside a sample; batch 1 and 5), every mask and score,
on every OpenCL device; and the library's choice between the two from their entries alone."""

from dataclasses import replace

import numpy as np
import pytest
from layers.test_attention import attention_reference, mha_reference
from support import described_gpu

import malinn
from malinn.choice import kernel_choice
from malinn.layers import AdditiveAttention, Attention, Masking, MultiHeadAttention
from malinn.library.kernel_library import load_library

pytestmark = pytest.mark.kernel_grid  # unoptimised builds on PoCL (tests/conftest.py)

OPENCL = [d for d in malinn.devices() if d.backend == "opencl"]


@pytest.fixture(params=OPENCL or [None], ids=lambda d: d.name if d is not None else "no-device")
def cl_device(request):
    """Each OpenCL device in turn, current; the kernel choices forgotten after (the tiled kernel has
    no GLSL source: an OpenGL device runs neither attention kernel)."""
    if request.param is None:
        pytest.fail("no working OpenCL device: run `bash .ci/setup` (it installs pocl-opencl-icd)")
    previous = malinn.get_device()
    malinn.set_device(request.param)
    yield request.param
    kernel_choice.forget()
    malinn.set_device(previous)


def _attention_launches(model, batch):
    return [launch.function for launch in model.plan(batch).launches if launch.function.startswith("attention")]


def _both(model, xs, batch, device, config):
    """The model's outputs with the attention kernel and with attention_tiled in ``config``, each
    checked to have run."""
    kernel_choice.use("attention", "attention", device)
    plain = model.predict(xs, verbose=0)
    assert set(_attention_launches(model, batch)) == {"attention"}
    kernel_choice.use("attention", "attention_tiled", device, config)
    tiled = model.predict(xs, verbose=0)
    assert set(_attention_launches(model, batch)) == {"attention_tiled"}
    return plain, tiled


def _check(tiled, plain, want):
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(tiled, plain, rtol=0, atol=1e-6 * scale)  # the same arithmetic, item for item
    np.testing.assert_allclose(tiled, want, rtol=0, atol=2e-5 * scale)


MHA_CASES = [  # batch, Tq, Tv, heads, key_dim, value_dim, BQ, BK
    (1, 1, 1, 1, 1, 1, 1, 1),
    (5, 3, 13, 2, 3, 3, 2, 4),  # blocks of 2 in samples of 3 queries, the last key tile of one
    (5, 13, 129, 3, 1, 3, 4, 16),
    (2, 17, 33, 1, 3, 3, 16, 32),  # a block of one query, two tiles: idle items run the tile loop too
    (1, 129, 3, 1, 64, 64, None, None),  # the entry's defines: BQ 64, BK 32
    (2, 64, 13, 2, 64, 3, None, None),
]


@pytest.mark.parametrize("case", MHA_CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("masked", ["none", "mask", "causal", "both"])
def test_multi_head_attention_tiled_matches_the_attention_kernel_and_numpy(cl_device, case, masked):
    batch, tq, tv, heads, kd, vd, bq, bk = case
    rng = np.random.default_rng(sum(case[:6]))
    q_in, v_in = malinn.Input((tq, 5)), malinn.Input((tv, 4))
    m_in = malinn.Input((tq, tv)) if masked in ("mask", "both") else None
    layer = MultiHeadAttention(heads, kd, value_dim=vd, mask_mode=("lowest", "zeroed", "added")[tv % 3])
    y = layer(q_in, v_in, attention_mask=m_in, use_causal_mask=masked in ("causal", "both"))
    model = malinn.Functional([t for t in (q_in, v_in, m_in) if t is not None], y)
    layer.set_weights([(rng.standard_normal(w.shape) * 0.5).astype(np.float32) for w in layer.get_weights()])
    q = rng.standard_normal((batch, tq, 5)).astype(np.float32)
    v = rng.standard_normal((batch, tv, 4)).astype(np.float32)
    m = (rng.random((batch, tq, tv)) > 0.4).astype(np.float32) if m_in is not None else None
    if m is not None:
        m[0, 0] = 0  # a query that may attend to nothing
    config = {"BQ": bq, "BK": bk} if bq else None
    plain, tiled = _both(model, [x for x in (q, v, m) if x is not None], batch, cl_device, config)
    _check(tiled, plain, mha_reference(layer, q.astype(np.float64), v.astype(np.float64), mask=m))


@pytest.mark.parametrize("kind", ["dot", "concat", "additive"])
@pytest.mark.parametrize("shape", [(5, 13, 3, 3, 3), (1, 3, 129, 1, 1)], ids=str)
def test_attention_layers_tiled_match_with_query_and_value_masks(cl_device, kind, shape):
    """Attention (dot, concat scores) and AdditiveAttention with query and value masks and the causal
    mask; the keys are the values (one tile serves both)."""
    batch, tq, tv, d, bq = shape
    rng = np.random.default_rng(tq + tv)
    layer = (
        AdditiveAttention()
        if kind == "additive"
        else Attention(use_scale=True, score_mode="concat" if kind == "concat" else "dot")
    )
    q_in, v_in, qm_in, vm_in = malinn.Input((tq, d)), malinn.Input((tv, d)), malinn.Input((tq,)), malinn.Input((tv,))
    model = malinn.Functional(
        [q_in, v_in, qm_in, vm_in], layer([q_in, v_in], mask=[qm_in, vm_in], use_causal_mask=True)
    )
    layer.set_weights([(rng.random(w.shape) + 0.5).astype(np.float32) for w in layer.get_weights()])
    q = rng.standard_normal((batch, tq, d)).astype(np.float32)
    v = rng.standard_normal((batch, tv, d)).astype(np.float32)
    qm = (rng.random((batch, tq)) > 0.3).astype(np.float32)
    vm = (rng.random((batch, tv)) > 0.3).astype(np.float32)
    vm[0] = 0  # a sample whose every key is masked
    plain, tiled = _both(model, [q, v, qm, vm], batch, cl_device, {"BQ": bq, "BK": 2})
    want = attention_reference(layer, *(x.astype(np.float64) for x in (q, v)), q_mask=qm, v_mask=vm)
    _check(tiled, plain, want)


def test_a_keras_mask_masks_the_queries_keys_in_the_tiled_kernel(cl_device):
    """Masking before a MultiHeadAttention: the query mask joins the attention mask (QMASK 2) and
    the value mask (VMASK) is read into the tile beside the keys."""
    rng = np.random.default_rng(5)
    batch, t, d = 5, 13, 4
    x_in = malinn.Input((t, d))
    masked = Masking(0.0)(x_in)
    layer = MultiHeadAttention(2, 3)
    model = malinn.Functional(x_in, layer(masked, masked))
    layer.set_weights([(rng.standard_normal(w.shape) * 0.5).astype(np.float32) for w in layer.get_weights()])
    x = rng.standard_normal((batch, t, d)).astype(np.float32)
    x[rng.random((batch, t)) > 0.7] = 0
    plain, tiled = _both(model, x, batch, cl_device, {"BQ": 4, "BK": 8})
    keep = (x != 0).any(-1)
    mask = (keep[:, :, None] & keep[:, None, :]).astype(np.float32)
    _check(tiled, plain, mha_reference(layer, x.astype(np.float64), x.astype(np.float64), mask=mask))


# ------------------------------------------------------------------ the choice, from library data

GPU = described_gpu()
ENCODER = {"NH": 4, "KD": 64, "VD": 64, "TQ": 128, "TS": 128, "VROW": 256}


def _chosen(device, **changes):
    return kernel_choice.choose("attention", device, defines={**ENCODER, **changes})


def test_a_gpu_runs_the_tiled_kernel_where_its_restrictions_hold():
    spec = _chosen(GPU)
    assert spec.codename == "attention_tiled" and spec.config["KD"] == "64" and spec.fits(GPU)
    # an OpenCL GPU's first default: 128 queries a work-group, keys in tiles of 16
    assert (spec.config["BQ"], spec.config["BK"]) == ("128", "16")
    assert load_library().default("attention", "gpu") == "attention_tiled"


@pytest.mark.parametrize(
    "device, changes",
    [(GPU, {"TQ": 40}), (replace(GPU, name="32-item GPU", max_work_group_size=32), {})],
    ids=["40 queries", "32-item work-groups"],
)
def test_the_next_default_configuration_serves_shorter_sequences_and_smaller_work_groups(device, changes):
    spec = _chosen(device, **changes)
    assert spec.codename == "attention_tiled" and spec.config["BQ"] == "16" and spec.fits(device)


@pytest.mark.parametrize(
    "device, changes, why",
    [
        (GPU, {"KD": 128, "VD": 128, "VROW": 512}, "heads larger than MAXD"),
        (GPU, {"TQ": 1}, "fewer queries than a work-group's items"),
        (replace(GPU, name="small GPU", local_memory=4096), {}, "tiles beyond the local memory"),
        (replace(GPU, name="narrow GPU", max_work_group_size=8), {}, "a work-group the device cannot launch"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_the_general_kernel_serves_what_the_tiled_one_cannot(device, changes, why):
    spec = _chosen(device, **changes)
    assert spec.codename == "attention", why
    assert spec.config["TQ"] == str(changes.get("TQ", 128))  # configured with the layer's defines


def test_an_explicit_tiled_choice_gives_way_where_it_cannot_run_the_layer():
    """``use`` picks a configuration of the tiled kernel; a layer it cannot run takes the first
    default that can, as a matmul whose chosen kernel's preconditions fail takes the fallbacks."""
    cpu = replace(GPU, name="test CPU", type="CPU", cache={})
    kernel_choice.use("attention", "attention_tiled", cpu, {"BQ": 32, "BK": 64})
    try:
        chosen = _chosen(cpu)
        assert chosen.codename == "attention_tiled" and (chosen.config["BQ"], chosen.config["BK"]) == ("32", "64")
        assert _chosen(cpu, TQ=20).config["BQ"] == "16"  # the defaults' second configuration
        assert _chosen(cpu, TQ=8).codename == "attention"  # the general kernel
    finally:
        kernel_choice.forget(cpu)


def test_the_tiled_entry_keeps_the_attention_kernels_arguments():
    library = load_library()
    plain, tiled = library["attention"], library["attention_tiled"]
    assert (tiled.arglist, tiled.buffers, tiled.ndrange) == (plain.arglist, plain.buffers, plain.ndrange)
    assert set(plain.config) <= set(tiled.config)
    assert tiled.requires_workgroup and tiled.workgroup == (1, 64)
    assert tiled.matrices["r"].col_multiple == 64  # every work-group whole
