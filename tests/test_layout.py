"""The layout engine against DESIGN.md's test vectors, numpy's orders and itself."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malinn.errors import LayoutError
from malinn.library.layout import Layout, convert, padded_shape, parse_layout

VECTORS = {
    ("R_2_4_R", (4, 8)): [
        [0, 1, 2, 3, 8, 9, 10, 11],
        [4, 5, 6, 7, 12, 13, 14, 15],
        [16, 17, 18, 19, 24, 25, 26, 27],
        [20, 21, 22, 23, 28, 29, 30, 31],
    ],
    ("C_4_2_C", (8, 4)): [
        [0, 4, 16, 20],
        [1, 5, 17, 21],
        [2, 6, 18, 22],
        [3, 7, 19, 23],
        [8, 12, 24, 28],
        [9, 13, 25, 29],
        [10, 14, 26, 30],
        [11, 15, 27, 31],
    ],
}


@pytest.mark.parametrize("key", list(VECTORS), ids=lambda k: k[0])
def test_design_test_vectors(key):
    rep, shape = key
    np.testing.assert_array_equal(Layout.parse(rep).index_table(shape), VECTORS[key])


def test_design_first_rows_and_columns():
    assert list(Layout.parse("R_4_4_R").index_table((8, 8))[0]) == [0, 1, 2, 3, 16, 17, 18, 19]
    assert list(Layout.parse("R_4_4_C").index_table((8, 8))[0]) == [0, 4, 8, 12, 16, 20, 24, 28]
    assert list(Layout.parse("C_4_4_C").index_table((8, 8))[:, 0]) == [0, 1, 2, 3, 16, 17, 18, 19]


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (13, 7), (4, 8)])
def test_r_and_c_are_numpys_row_and_column_major(shape):
    m = np.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape)
    np.testing.assert_array_equal(Layout.parse("R").pack(m), m.ravel(order="C"))
    np.testing.assert_array_equal(Layout.parse("C").pack(m), m.ravel(order="F"))


@pytest.mark.parametrize(
    "rep", ["R", "C", "R_2_4_R", "C_4_2_C", "R_4_4_R", "C_4_4_C", "R_4_4_C", "R_16_16_C_4_4_R", "C_8_4_R_2_2_C_1_1_R"]
)
def test_index_is_a_permutation(rep):
    layout = Layout.parse(rep)
    padded = layout.padded_shape(37, 21, 4, 4)
    table = layout.index_table(padded)
    np.testing.assert_array_equal(np.sort(table.ravel()), np.arange(padded[0] * padded[1]))


@pytest.mark.parametrize("rep", ["R", "C", "R_2_4_R", "C_4_2_C", "R_16_16_C_4_4_R"])
def test_pack_agrees_with_the_index_formula(rep):
    layout = Layout.parse(rep)
    m = np.random.default_rng(0).standard_normal((19, 45)).astype(np.float32)
    padded = layout.padded_shape(*m.shape, 4, 4)
    full = np.zeros(padded, np.float32)
    full[:19, :45] = m
    expected = np.empty(padded[0] * padded[1], np.float32)
    expected[layout.index_table(padded)] = full
    np.testing.assert_array_equal(layout.pack(m, padded), expected)


def test_padding_is_zero_and_sizes_follow_chunks_and_alignment():
    layout = Layout.parse("C_4_2_C")
    assert layout.padded_shape(5, 3) == (8, 4)
    assert layout.padded_shape(5, 3, row_align=8, col_align=3) == (8, 6)
    assert padded_shape("R", 1, 1) == (1, 1)
    flat = layout.pack(np.ones((5, 3), np.float32))
    assert flat.size == 32 and flat.sum() == 15


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "representation string"),
        ("X", "bad token 'X' at position 0"),
        ("r", "bad token 'r'"),
        ("R_2", "tokens"),
        ("R_2_4", "tokens"),
        ("R_2_a_R", "bad token 'a' at position 2"),
        ("R_0_4_R", "bad token '0'"),
        ("R_-2_4_R", "bad token '-2'"),
        ("R_2_4_Q", "bad token 'Q' at position 3"),
        ("R_4_4_R_3_4_C", "does not divide its parent chunk 4x4"),
        ("R_16_16_C_4_5_R", "does not divide"),
    ],
)
def test_malformed_layouts_are_rejected_clearly(text, fragment):
    with pytest.raises(LayoutError, match=fragment.replace("(", r"\(")):
        Layout.parse(text)


def test_layout_error_is_a_value_error():
    with pytest.raises(ValueError):
        parse_layout(None)


def test_str_round_trips():
    for rep in ["R", "C_4_2_C", "R_16_16_C_4_4_R"]:
        assert str(Layout.parse(rep)) == rep


def test_unpack_rejects_wrong_sizes_and_pack_rejects_misfits():
    layout = Layout.parse("C_4_2_C")
    with pytest.raises(LayoutError, match="not 8x4"):
        layout.unpack(np.zeros(31, np.float32), (5, 3), (8, 4))
    with pytest.raises(LayoutError, match="whole number"):
        layout.pack(np.zeros((5, 3)), (6, 4))
    with pytest.raises(LayoutError, match="does not fit"):
        layout.pack(np.zeros((9, 3)), (8, 4))
    with pytest.raises(LayoutError, match="2-D"):
        layout.pack(np.zeros(3))


layouts = st.sampled_from(
    ["R", "C", "R_2_4_R", "C_4_2_C", "R_4_4_R", "C_4_4_C", "R_4_4_C", "R_8_4_C_2_2_R", "C_16_16_R_4_4_C"]
)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 40),
    rep=layouts,
    ra=st.sampled_from([1, 2, 4, 8]),
    ca=st.sampled_from([1, 2, 4, 8]),
)
def test_pack_unpack_round_trip(rows, cols, rep, ra, ca):
    m = np.random.default_rng(rows * 41 + cols).standard_normal((rows, cols)).astype(np.float32)
    layout = Layout.parse(rep)
    padded = layout.padded_shape(rows, cols, ra, ca)
    assert padded[0] % ra == 0 and padded[1] % ca == 0
    np.testing.assert_array_equal(layout.unpack(layout.pack(m, padded), m.shape, padded), m)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 30), cols=st.integers(1, 30), src=layouts, dst=layouts)
def test_layout_to_layout_conversion(rows, cols, src, dst):
    m = np.random.default_rng(rows + 100 * cols).standard_normal((rows, cols)).astype(np.float32)
    sp = padded_shape(src, rows, cols, 4, 4)
    dp = padded_shape(dst, rows, cols)
    flat = convert(Layout.parse(src).pack(m, sp), m.shape, src, sp, dst, dp)
    np.testing.assert_array_equal(flat, Layout.parse(dst).pack(m, dp))
