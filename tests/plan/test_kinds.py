"""The op kinds (malinn/plan/kinds): each registered once, found by name, and every step of a
compiled plan of each kind."""

from __future__ import annotations

import importlib
import pkgutil

import numpy as np
import pytest
from support import assert_close

from malinn import Sequential
from malinn.layers import Dense, Flatten, Reshape
from malinn.plan import kinds
from malinn.plan.kinds import KINDS, MATMUL, OpKind, kind_named, register


def test_each_kind_is_registered_once_under_its_own_name():
    """Every OpKind a module of malinn/plan/kinds defines is the one registered under its name (the
    package imports every module: a kind nobody imports would never lower a layer)."""
    defined = {}
    for info in pkgutil.iter_modules(kinds.__path__):
        module = importlib.import_module(f"malinn.plan.kinds.{info.name}")
        for value in vars(module).values():
            if isinstance(value, OpKind):
                defined[id(value)] = value
    assert sorted(k.name for k in defined.values()) == sorted(KINDS)
    assert {
        "matmul",
        "conv",
        "bias",
        "activation",
        "affine",
        "relayout",
        "reshape",
        "permute",
        "repeat",
        "merge",
        "concat",
        "dot",
        "broadcast",
        "normalize",
        "pool",
        "spatial",
        "im2col",
    } <= set(KINDS)
    for name, kind in KINDS.items():
        assert isinstance(kind, OpKind) and kind.name == name and kind_named(name) is kind


def test_an_unknown_kind_is_refused_with_the_known_ones_listed():
    with pytest.raises(KeyError, match="no op kind 'lstm'; the plan knows activation, affine"):
        kind_named("lstm")


def test_a_second_registration_of_a_name_is_refused():
    class Again(OpKind):
        name = "matmul"

    with pytest.raises(ValueError, match="'matmul' is registered twice"):
        register(Again())
    assert KINDS["matmul"] is MATMUL


def test_a_plan_describes_each_step_by_its_kind_and_computes_keras_values(device, rng):
    model = Sequential(
        [
            Dense(7, activation="relu", name="d0"),
            Reshape((7, 1), name="r"),
            Flatten(name="f"),
            Dense(3, activation="softmax", name="d1"),
        ]
    )
    model.build((None, 13))
    model.set_weights([w + rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
    plan = model.plan(5, device)
    rows = plan.describe()
    assert [row["kind"] for row in rows] == [step.kind.name for step in plan.steps]
    assert all(step.kind is KINDS[step.kind.name] for step in plan.steps)
    matmuls = [row for row in rows if row["kind"] == "matmul"]
    assert len(matmuls) == 2 and "relu" in matmuls[0]["fused"]
    x = rng.standard_normal((5, 13)).astype(np.float32)
    w0, b0, w1, b1 = model.get_weights()
    h = np.maximum(x @ w0 + b0, 0)
    z = h @ w1 + b1
    expected = np.exp(z - z.max(axis=1, keepdims=True))
    assert_close(model.predict(x), expected / expected.sum(axis=1, keepdims=True))
