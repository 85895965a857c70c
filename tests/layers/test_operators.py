"""Operators and scale layers against numpy on odd shapes on every device (ConstantOperation,
Divide, LayerScale, CustomScaleLayer), and converted from Keras 3 and tf_keras files (.keras and
.h5) equal to Keras's own predict within 1e-5 x max(1, |y|): the models of
tests/layers/operators_zoo.py, and keras.applications' MobileNetV3Small, ConvNeXtTiny,
InceptionResNetV2 and tf_keras's RegNetX002 (``MALINN_SLOW_TESTS=1``: they take minutes to build
and compile on two cores), each built in a process of its own once per test run."""

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import built_zoo
from operators_zoo import APPLICATIONS, BATCHES, GENERATIONS, MODELS, SUFFIXES
from support import assert_close

import malinn
from malinn import Functional, Input
from malinn.converters import read_keras
from malinn.converters.to_malinn import to_model
from malinn.errors import ConversionError
from malinn.layers import ConstantOperation, CustomScaleLayer, Dense, Divide, LayerScale
from malinn.layers.keras_config import KerasContext, NotConvertible
from malinn.layers.operators import operator_layer

ZOO = Path(__file__).with_name("operators_zoo.py")
SLOW = os.environ.get("MALINN_SLOW_TESTS") == "1"


# ---------------------------------------------------------------- numpy references, every device
@pytest.mark.parametrize("shape", [(1,), (13,), (3, 1), (2, 3, 5)])
@pytest.mark.parametrize(
    "op, first, reference",
    [
        ("add", False, lambda x, c: x + c),
        ("subtract", False, lambda x, c: x - c),
        ("subtract", True, lambda x, c: c - x),
        ("multiply", True, lambda x, c: c * x),
        ("divide", False, lambda x, c: x / c),
        ("maximum", False, np.maximum),
        ("minimum", False, np.minimum),
    ],
)
def test_constant_operation_on_a_scalar_and_per_channel(device, rng, shape, op, first, reference):
    x = (rng.standard_normal((3,) + shape) * 2).astype(np.float32)
    for constant in (np.float32(0.7), np.float32(-1.5), (rng.random(shape[-1]) + 0.5).astype(np.float32)):
        i = Input(shape, name="x")
        model = Functional(i, ConstantOperation(op, constant, first)(i))
        assert_close(model.predict(x), reference(x, constant))


def test_hard_sigmoid_of_operators_equals_keras_bit_for_bit(device, rng):
    """MobileNetV3's ``relu6(x + 3) * (1/6)`` as Keras 3 computes it in float32, within 1e-6."""
    x = (rng.standard_normal((5, 7)) * 4).astype(np.float32)
    i = Input((7,))
    y = ConstantOperation("multiply", 1.0 / 6.0)(malinn.layers.ReLU(6.0)(ConstantOperation("add", 3.0)(i)))
    want = np.clip(x + np.float32(3.0), 0, 6) * np.float32(1.0 / 6.0)
    np.testing.assert_allclose(Functional(i, y).predict(x), want, rtol=0, atol=1e-6)


def test_constant_broadcast_over_two_trailing_axes(device, rng):
    x = rng.standard_normal((2, 4, 3, 5)).astype(np.float32)
    c = rng.standard_normal((3, 5)).astype(np.float32)
    i = Input((4, 3, 5))
    assert_close(Functional(i, ConstantOperation("add", c)(i)).predict(x), x + c)
    assert_close(Functional(i, ConstantOperation("maximum", c)(i)).predict(x), np.maximum(x, c))


def test_divide_of_two_tensors_either_of_them_broadcast(device, rng):
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    b = (rng.random((3, 1, 5)) + 0.5).astype(np.float32)
    x, y = Input((4, 5), name="a"), Input((1, 5), name="b")
    model = Functional([x, y], [Divide()([x, y]), Divide()([y, x])])
    got = model.predict({"a": a, "b": b})
    assert_close(got[0], a / b)
    assert_close(got[1], b / a, rtol=1e-4)


@pytest.mark.parametrize("shape", [(1,), (3, 5), (2, 1, 7)])
def test_layer_scale_and_custom_scale(device, rng, shape):
    x = rng.standard_normal((3,) + shape).astype(np.float32)
    z = rng.standard_normal((3,) + shape).astype(np.float32)
    scale = LayerScale(1e-6, shape[-1])
    i, j = Input(shape, name="x"), Input(shape, name="z")
    model = Functional([i, j], [scale(i), CustomScaleLayer(0.17)([i, j])])
    gamma = rng.standard_normal(shape[-1]).astype(np.float32)
    scale.set_weights([gamma])
    got = model.predict({"x": x, "z": z})
    assert_close(got[0], x * gamma)
    assert_close(got[1], x + z * np.float32(0.17))


def test_layer_scale_folds_into_the_dense_before(device, rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    model = malinn.Sequential([Dense(3), LayerScale(0.5, 3)])
    model.build((None, 6))
    kernel, bias, gamma = model.get_weights()
    assert_close(model.predict(x), (x @ kernel + bias) * gamma)


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda: ConstantOperation("power", 2.0), "op must be one of"),
        (lambda: ConstantOperation("add", float("inf")), "finite"),
        (lambda: ConstantOperation("divide", 2.0, constant_first=True), "divides by a nonzero constant"),
        (lambda: ConstantOperation("divide", 0.0), "by zero"),
        (lambda: LayerScale(float("nan"), 3), "finite"),
        (lambda: LayerScale(1e-6, 0), "positive integer"),
        (lambda: CustomScaleLayer("a"), "finite number"),
    ],
)
def test_operator_layers_validate(make, fragment):
    with pytest.raises(ValueError, match=fragment):
        make()


def test_a_constant_that_grows_the_input_is_refused():
    i = Input((1, 4))
    with pytest.raises(ValueError, match=r"does not broadcast to inputs of shape \(None, 1, 4\)"):
        ConstantOperation("add", np.ones((3, 4), np.float32))(i)


@pytest.mark.parametrize(
    "function, fragment",
    [
        ("math.cumsum", "a Keras 3 save of the model may convert"),
        ("math.pow", "(tf.math.pow)"),
    ],
)
def test_tf_operators_malinn_lacks_are_refused_by_name(function, fragment):
    keras = KerasContext(class_name="TFOpLambda", name="op", keras_major=2, input_shape=(None, 3))
    with pytest.raises(NotConvertible, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        operator_layer({"function": function}, {}, keras)
    with pytest.raises(NotConvertible, match="dividing a constant"):
        operator_layer({"function": "math.truediv"}, {"constant": 2.0, "first": True, "options": {}}, keras)


# ---------------------------------------------------------------- Keras's own files
def _zoo(tmp_path_factory, name: str, *args: str) -> Path:
    return built_zoo(tmp_path_factory, ZOO, args=args, name=name)


@pytest.fixture(scope="session")
def operators_zoo(tmp_path_factory) -> Path:
    """The zoo's folder, built once per test run (every xdist worker reads the one built)."""
    return _zoo(tmp_path_factory, "operators_zoo")


@pytest.fixture(scope="session")
def applications_zoo(tmp_path_factory) -> Path:
    """The zoo with keras.applications' models, built once per test run."""
    return _zoo(tmp_path_factory, "operators_applications_zoo", "--applications")


def _assert_equals_keras(path: Path, data_path: Path) -> None:
    model = malinn.load_model(str(path))
    data = np.load(data_path)
    for batch in BATCHES:
        want = data[f"y{batch}"]
        got = model.predict(data[f"x{batch}"])
        assert got.shape == want.shape, path.name
        np.testing.assert_allclose(
            got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())), err_msg=str(path)
        )


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("key", list(MODELS))
def test_converted_model_equals_keras(device, operators_zoo, key, generation, suffix):
    _assert_equals_keras(operators_zoo / generation / f"{key}{suffix}", operators_zoo / generation / f"{key}.npz")


@pytest.mark.skipif(not SLOW, reason="keras.applications' models take minutes on two cores: MALINN_SLOW_TESTS=1")
def test_applications_equal_keras(applications_zoo):
    """MobileNetV3Small, ConvNeXtTiny, InceptionResNetV2 (Keras 3 and tf_keras) and RegNetX002
    (tf_keras), random weights, in both file forms, on the current device."""
    checked = []
    for key, (generations, *_) in APPLICATIONS.items():
        for generation in generations:
            for suffix in SUFFIXES:
                _assert_equals_keras(
                    applications_zoo / generation / f"{key}{suffix}", applications_zoo / generation / f"{key}.npz"
                )
                checked.append(f"{generation}/{key}{suffix}")
    assert len(checked) == 14


def test_an_operator_with_a_constant_malinn_lacks_is_refused_by_name(operators_zoo, tmp_path):
    """A Keras 3 operation of a constant malinn computes no layer for (x ** 2) stays refused by name
    and constant; the rest of the file converts."""
    import json
    import zipfile

    source = operators_zoo / "keras3" / "constant_scalars.keras"
    target = tmp_path / "power.keras"
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename == "config.json":
                config = json.loads(data)
                for layer in config["config"]["layers"]:
                    if layer["class_name"] == "TrueDivide":
                        layer["class_name"] = layer["registered_name"] = "Power"
                data = json.dumps(config).encode()
            zout.writestr(item, data)
    with pytest.raises(ConversionError, match=r"Power 'true_divide' with a constant operand \(4\.0\): malinn computes"):
        to_model(read_keras(str(target)))
