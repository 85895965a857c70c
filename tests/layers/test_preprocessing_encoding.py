"""CategoryEncoding and IntegerLookup against numpy definitions on every device (odd shapes: 1, 3, 13
and 1001 indices a sample, vocabularies of 1 and 1000 tokens, indices outside the range and tokens
outside the vocabulary), their refusals, and the models of tests/layers/encoding_zoo.py (the
encodings, the lookups, a tabular model and the bicubic and area resizes) converted from Keras 3 and
tf_keras files (.keras and .h5) equal to Keras's own predict: exactly for the integer outputs, within
1e-5 x max(1, |y|) for the rest. The zoo is built in a process of its own once per test run."""

import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import built_zoo
from encoding_references import category_encoding_reference, integer_lookup_reference
from encoding_zoo import BATCHES, GENERATIONS, MODELS, SUFFIXES, THOUSAND, VOCABULARY

import malinn
from malinn.errors import ConversionError
from malinn.layers import CategoryEncoding, IntegerLookup

#: idf weights of VOCABULARY's tokens (their mean, 1.5, the OOV indices')
IDF = [0.5, 1.25, 2.0, 0.75, 3.0, 1.5]

ZOO = Path(__file__).with_name("encoding_zoo.py")


def _predict(layer, shape, x):
    model = malinn.Sequential([layer])
    model.build((None,) + shape)
    return model.predict(x)


@pytest.mark.kernel_grid
@pytest.mark.parametrize("mode", ["one_hot", "multi_hot", "count"])
@pytest.mark.parametrize("width,num_tokens", [(1, 1), (3, 5), (13, 7), (1001, 4)])
def test_category_encoding_matches_the_definition(device, rng, mode, width, num_tokens):
    """Indices drawn from [-2, num_tokens + 2), so some are outside: a one-hot of them is zeros, a
    multi-hot or count leaves out those past the end and is NaN for a sample with a negative one."""
    layer = CategoryEncoding(num_tokens, mode)
    for batch in (1, 3):
        x = rng.integers(-2, num_tokens + 2, (batch, width)).astype(np.float32)
        x[0, 0] += 0.75  # truncated toward zero, as Keras's cast
        want = category_encoding_reference(x, num_tokens, mode)
        got = _predict(layer, (width,), x)
        assert got.shape == want.shape == layer.compute_output_shape((batch, width))
        np.testing.assert_array_equal(got, want)


def test_category_encoding_of_indices_in_range_is_keras_s(device):
    x = np.array([[3, 2, 0, 1]], np.float32)
    one_hot = _predict(CategoryEncoding(4, "one_hot"), (4,), x)
    np.testing.assert_array_equal(one_hot[0], np.eye(4)[[3, 2, 0, 1]])
    counts = _predict(CategoryEncoding(4, "count"), (4,), np.array([[0, 1, 1, 3], [2, 2, 2, 2]], np.float32))
    np.testing.assert_array_equal(counts, [[1, 2, 0, 1], [0, 0, 4, 0]])
    hot = _predict(CategoryEncoding(4, "multi_hot"), (2,), np.array([[0, 1], [0, 0], [1, 2], [3, 1]], np.float32))
    np.testing.assert_array_equal(hot, [[1, 1, 0, 0], [1, 0, 0, 0], [0, 1, 1, 0], [0, 1, 0, 1]])


@pytest.mark.kernel_grid
@pytest.mark.parametrize(
    "vocabulary,options,width",
    [
        ([7], dict(), 1),
        ([7], dict(num_oov_indices=0, output_mode="one_hot"), 1),
        (VOCABULARY, dict(mask_token=0, num_oov_indices=3), 13),
        (VOCABULARY, dict(num_oov_indices=0, mask_token=0, output_mode="count"), 3),
        (VOCABULARY, dict(mask_token=0, num_oov_indices=2, output_mode="multi_hot"), 3),
        (VOCABULARY, dict(output_mode="one_hot", max_tokens=11, pad_to_max_tokens=True), 3),
        (THOUSAND, dict(num_oov_indices=5), 1001),
        (THOUSAND, dict(mask_token=0, output_mode="count"), 13),
        ([7], dict(output_mode="tf_idf", idf_weights=[0.75]), 1),
        (VOCABULARY, dict(mask_token=0, num_oov_indices=2, output_mode="tf_idf", idf_weights=IDF), 13),
        (VOCABULARY, dict(output_mode="tf_idf", idf_weights=IDF, max_tokens=11, pad_to_max_tokens=True), 3),
    ],
)
def test_integer_lookup_matches_the_definition(device, rng, vocabulary, options, width):
    """Tokens of the vocabulary, outside it (negative too: floormod; beyond 2^32, which the GL
    kernel's 32-bit integers reach through the float's exponent), the mask token, a fraction
    (truncated) and NaN; without OOV indices an unknown token is NaN."""
    layer = IntegerLookup(vocabulary=vocabulary, **options)
    pool = np.r_[vocabulary, 0, 5, -7, 1139, 2.5, -3.5, 16777216, -16777216, 1e10, -3e18, np.nan]
    for batch in (1, 3):
        x = rng.choice(pool, (batch, width)).astype(np.float32)
        want = integer_lookup_reference(layer, x)
        got = _predict(layer, (width,), x)
        assert got.shape == want.shape == layer.compute_output_shape((batch, width))
        np.testing.assert_array_equal(got, want)


def test_tf_idf_weights_are_padded_as_keras_pads_them(device):
    """The OOV indices weighted by the mean where the vocabulary is given without them, by the given
    weights where it starts with them; zeros up to max_tokens (Keras's IndexLookup.set_vocabulary)."""
    plain = IntegerLookup(vocabulary=[12, 36, 42], idf_weights=[1.0, 2.0, 4.5], output_mode="tf_idf", num_oov_indices=2)
    plain.build((None, 3))
    np.testing.assert_array_equal(plain.idf_weights, [2.5, 2.5, 1.0, 2.0, 4.5])
    special = IntegerLookup(
        vocabulary=[-1, 12, 36], idf_weights=[0.5, 1.0, 2.0], output_mode="tf_idf", max_tokens=6, pad_to_max_tokens=True
    )
    special.build((None, 3))
    np.testing.assert_array_equal(special.idf_weights, [0.5, 1.0, 2.0, 0, 0, 0])
    got = _predict(special, (3,), np.array([[36, 36, 5], [12, 0, 0]], np.float32))
    np.testing.assert_array_equal(got, [[0.5, 0, 4, 0, 0, 0], [1.0, 1.0, 0, 0, 0, 0]])
    again = IntegerLookup.from_config(special.get_config())
    again.build((None, 3))
    np.testing.assert_array_equal(again.idf_weights, special.idf_weights)


def test_integer_lookup_indices_are_keras_s(device):
    """Keras's documented example: vocabulary [12, 1138, 42], mask 0, one OOV index."""
    layer = IntegerLookup(vocabulary=[12, 1138, 42], mask_token=0)
    got = _predict(layer, (4,), np.array([[12, 1138, 42], [42, 1000, 36]], np.float32)[:, [0, 1, 2, 2]])
    np.testing.assert_array_equal(got, [[2, 3, 4, 4], [4, 1, 1, 1]])
    assert layer.get_vocabulary() == [0, -1, 12, 1138, 42]
    hashed = IntegerLookup(vocabulary=[12, 1138, 42], num_oov_indices=2)
    np.testing.assert_array_equal(_predict(hashed, (3,), np.array([[1000, -1, 42]], np.float32)), [[0, 1, 4]])


def test_a_vocabulary_listed_with_its_special_tokens_is_read_without_them():
    layer = IntegerLookup(vocabulary=[0, -1, -1, 12, 36], mask_token=0, num_oov_indices=2)
    assert layer.tokens == [12, 36] and layer.vocabulary_size() == 5
    again = IntegerLookup.from_config(layer.get_config())
    assert again.tokens == layer.tokens and again.get_vocabulary() == layer.get_vocabulary()
    # the OOV token as a real token after the special ones stays a token
    assert IntegerLookup(vocabulary=[-1, -1, 5]).tokens == [-1, 5]
    assert IntegerLookup.from_config(IntegerLookup(vocabulary=[-1, -1, 5]).get_config()).tokens == [-1, 5]
    assert IntegerLookup.from_config(IntegerLookup(vocabulary=[4, 5], oov_token=None).get_config()).tokens == [4, 5]


def test_a_tabular_model_runs_in_a_malinn_file(device, rng, tmp_path):
    category, codes = malinn.Input((1,), dtype="int64"), malinn.Input((2,), dtype="int64")
    encoded = [IntegerLookup(vocabulary=VOCABULARY, output_mode="one_hot")(category), CategoryEncoding(6)(codes)]
    model = malinn.Functional([category, codes], malinn.layers.Concatenate()(encoded))
    xs = [rng.choice(np.r_[VOCABULARY, 3], (3, 1)), rng.integers(0, 6, (3, 2))]
    lookup = next(layer for layer in model.layers if isinstance(layer, IntegerLookup))
    want = np.concatenate(
        [integer_lookup_reference(lookup, xs[0]), category_encoding_reference(xs[1], 6, "multi_hot")], axis=1
    )
    np.testing.assert_array_equal(model.predict(xs), want)
    model.save(str(tmp_path / "tabular.malinn"))
    np.testing.assert_array_equal(malinn.load_model(str(tmp_path / "tabular.malinn")).predict(xs), want)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: CategoryEncoding(0), "num_tokens must be a positive integer"),
        (lambda: CategoryEncoding(4, "tf_idf"), "output_mode must be one of"),
        (lambda: CategoryEncoding(4, sparse=True), "sparse=True"),
        (lambda: IntegerLookup(vocabulary=[1, 2], invert=True), "invert=True"),
        (lambda: IntegerLookup(vocabulary=[1, 2], output_mode="tf_idf"), "idf_weights are given with output_mode"),
        (lambda: IntegerLookup(vocabulary=[1, 2], idf_weights=[1, 2]), "idf_weights are given with output_mode"),
        (lambda: IntegerLookup(vocabulary=[1, 2], output_mode="tf_idf", idf_weights=[1]), "one number per"),
        (lambda: IntegerLookup(vocabulary=[1, 2], output_mode="count", sparse=True), "sparse=True"),
        (lambda: IntegerLookup(vocabulary=[1, 2], oov_method="farmhash"), "floormod"),
        (lambda: IntegerLookup(), "give the vocabulary"),
        (lambda: IntegerLookup(vocabulary="vocabulary.txt"), "give the vocabulary"),
        (lambda: IntegerLookup(vocabulary=[1, 2, 1]), r"repeats tokens \[1\]"),
        (lambda: IntegerLookup(vocabulary=[1, 0], mask_token=0), "mask token 0 is in the vocabulary"),
        (lambda: IntegerLookup(vocabulary=[1, 2**24 + 1]), "beyond 2.24"),
        (lambda: IntegerLookup(vocabulary=[1, 2, 3], max_tokens=3), "larger than max_tokens=3"),
        (lambda: IntegerLookup(vocabulary=[1.5]), "must be an integer"),
    ],
)
def test_what_keras_or_malinn_refuses_is_refused_by_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_multi_hot_takes_samples_of_one_axis():
    with pytest.raises(ValueError, match=r"encodes samples of shape \(batch, k\)"):
        CategoryEncoding(4, "count").build((None, 2, 3))
    with pytest.raises(ValueError, match=r"encodes samples of shape \(batch, k\)"):
        IntegerLookup(vocabulary=[3], output_mode="multi_hot").build((None, 2, 3))
    assert CategoryEncoding(4, "one_hot").compute_output_shape((None, 2, 3)) == (None, 2, 3, 4)


def test_count_weights_are_refused_by_name():
    """Keras saves a call with ``count_weights`` as a second input, which malinn does not weigh by."""
    with pytest.raises(ValueError, match=r"count_weights \(a second input, 2 inputs given\) is not computed"):
        CategoryEncoding(4, "count").build([(None, 3), (None, 3)])


# ------------------------------------------------------------------------------ Keras's files


@pytest.fixture(scope="session")
def encoding_zoo(tmp_path_factory) -> Path:
    """The zoo's folder, built once per test run (every xdist worker reads the one built)."""
    return built_zoo(tmp_path_factory, ZOO)


FILES = [
    (key, generation, suffix)
    for key, spec in MODELS.items()
    for generation in GENERATIONS
    if generation in spec["generations"]
    for suffix in spec.get("suffixes", SUFFIXES)
]


def _check(model, data, count: int) -> None:
    for batch in BATCHES:
        xs = [data[f"x{batch}_{i}"] for i in range(count)]
        want = data[f"y{batch}"]
        got = model.predict(xs if count > 1 else xs[0])
        assert got.shape == want.shape
        if np.issubdtype(want.dtype, np.integer) or np.array_equal(want, np.round(want)):
            np.testing.assert_array_equal(got, want)  # indices and encodings: exact
        else:
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("key,generation,suffix", FILES)
def test_converted_model_equals_keras(device, encoding_zoo, key, generation, suffix):
    model = malinn.load_model(str(encoding_zoo / generation / f"{key}{suffix}"))
    _check(model, np.load(encoding_zoo / generation / f"{key}.npz"), len(MODELS[key]["inputs"]))


@pytest.mark.parametrize("generation", GENERATIONS)
def test_an_adapted_vocabulary_is_read_from_the_assets_of_an_unzipped_keras_folder(encoding_zoo, generation, tmp_path):
    folder = tmp_path / "model"
    with zipfile.ZipFile(encoding_zoo / generation / "lookup_adapted.keras") as archive:
        assert any(name.endswith("/vocabulary.txt") for name in archive.namelist())
        archive.extractall(folder)
    _check(malinn.load_model(str(folder)), np.load(encoding_zoo / generation / "lookup_adapted.npz"), 1)
    shutil.rmtree(folder / "assets")  # without its assets the layer has no vocabulary: refused by name
    with pytest.raises(ConversionError, match=r"IntegerLookup 'integer_lookup\w*' without its vocabulary"):
        malinn.load_model(str(folder))


def test_keras3_h5_of_an_adapted_lookup_is_refused_by_name(encoding_zoo):
    """Keras 3 writes an adapted IntegerLookup to .h5 without its vocabulary (Keras itself then
    looks up nothing): refused, saying to save a .keras file."""
    with pytest.raises(ConversionError, match="without its vocabulary.*save the model as .keras"):
        malinn.load_model(str(encoding_zoo / "keras3" / "lookup_adapted_lost.h5"))


def test_string_lookup_is_refused_by_name(encoding_zoo, tmp_path):
    """A StringLookup's string input is refused first; its input edited to int64, the layer itself."""
    source = encoding_zoo / "keras3" / "string_lookup.keras"
    with pytest.raises(ConversionError, match="dtype 'string' is not supported"):
        malinn.load_model(str(source))
    edited = tmp_path / "string_lookup.keras"
    with zipfile.ZipFile(source) as archive, zipfile.ZipFile(edited, "w") as out:
        for name in archive.namelist():
            data = archive.read(name)
            out.writestr(name, data.replace(b'"string"', b'"int64"') if name == "config.json" else data)
    with pytest.raises(ConversionError, match="StringLookup 'string_lookup.*malinn takes numeric arrays only"):
        malinn.load_model(str(edited))
