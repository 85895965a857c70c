"""The library's integer expressions: values, errors, and the compiled form kept per text."""

import pytest

from malinn.library.expressions import _compiled, evaluate, names_in


@pytest.mark.parametrize(
    "text, values, expected",
    [
        ("MWG / MDIMC", {"MWG": "64", "MDIMC": "8"}, 8),
        ("7 / 2", {}, 3),
        ("-A % 5", {"A": 7}, 3),
        ("A % B == 0 and B <= 16", {"A": 64, "B": 16}, 1),
        ("1 < A < 3", {"A": 3}, 0),
        ("not A or B", {"A": 1, "B": 0}, 0),
        (12, {}, 12),
    ],
)
def test_values(text, values, expected):
    assert evaluate(text, values) == expected
    assert evaluate(text, values) == expected  # the second time from the compiled form


@pytest.mark.parametrize(
    "text, values, message",
    [
        ("A / B", {"A": 1, "B": 0}, "divides by zero"),
        ("A + C", {"A": 1}, "names 'C'"),
        ("A +", {"A": 1}, "cannot parse"),
        ("A ** 2", {"A": 2}, "only integers"),
        (True, {}, "expected an integer"),
        (1.5, {}, "expected an integer"),
    ],
)
def test_errors_every_time(text, values, message):
    for _ in range(2):  # a cached text fails again, with the same message
        with pytest.raises(ValueError, match=message):
            evaluate(text, values)


def test_chains_stop_at_the_first_false_link_and_bool_ops_evaluate_every_operand():
    assert evaluate("2 < 1 < X", {}) == 0  # X is never looked up
    with pytest.raises(ValueError, match="names 'X'"):
        evaluate("0 and X", {})  # and/or evaluate every operand
    assert names_in("A * B + 3") == {"A", "B"}


def test_one_compiled_form_per_text():
    _compiled.cache_clear()
    for n in range(5):
        evaluate("A * 2 + B", {"A": n, "B": 1})
    info = _compiled.cache_info()
    assert (info.misses, info.hits) == (1, 4)
